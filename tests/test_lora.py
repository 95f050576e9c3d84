"""LoRA (model.lora): only adapters train and checkpoint; engines get W + alpha/r·B·A under base names."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from toolrl.cli import cli
from toolrl.config import ConfigError, LoraConfig, load_config
from toolrl.model_sources import load_model
from toolrl.modeling.adapters import apply_lora, has_lora, lora_layers
from toolrl.plugins import get_plugins
from toolrl.plugins.registry import Part
from toolrl.training import lora

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "examples" / "tiny.yaml")
QV = LoraConfig(r=8, alpha=16, target_modules=["q_proj", "v_proj"])


def lora_model(path: str, config: LoraConfig = QV, dtype: str = "float32", seed: int = 0) -> torch.nn.Module:
    """The tiny model with adapters drawn from ``seed`` (:func:`draw_adapters`)."""
    return draw_adapters(apply_lora(load_model(path, dtype=dtype), config), seed)


def draw_adapters(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """``model`` with every LoRA tensor drawn from ``seed`` (peft draws A from the global RNG and starts B
    at zero, which would hide a missing or wrong merge, or a wrong route)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    return model


def peft_merged(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """peft's own merge (on a copy), for reference."""
    from peft.tuners.lora import LoraLayer

    ref = copy.deepcopy(model)
    for m in ref.modules():
        if isinstance(m, LoraLayer):
            m.merge()
    return {k.replace("base_layer.", ""): v for k, v in ref.state_dict().items() if "lora_" not in k}


def test_only_adapters_are_trainable(tiny_qwen3_path):
    model = apply_lora(load_model(tiny_qwen3_path), QV)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert len(names) == 2 * 2 * 2  # 2 layers × (q_proj, v_proj) × (A, B)
    assert all("lora_" in n for n in names), names
    assert len(lora.trainable_parameters(model)) == len(names)
    assert list(lora.trainable_state_dict(model)) == names
    everything = apply_lora(load_model(tiny_qwen3_path), LoraConfig())  # all-linear
    kinds = {n.split(".")[-1] for n in lora_layers(everything)}
    assert kinds == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


def test_adapters_get_gradients_under_gradient_checkpointing(tiny_qwen3_path):
    # The classic peft pitfall: with reentrant checkpointing and frozen embeddings no input of a
    # checkpointed layer requires grad, so its adapters get none. transformers 5 avoids it (non-reentrant
    # by default); this guards the combination compose() builds.
    model = lora_model(tiny_qwen3_path)
    model.gradient_checkpointing_enable()
    model.train()
    ids = torch.arange(100, 110)[None]
    model(input_ids=ids, labels=ids).loss.backward()
    grads = [p.grad for p in lora.trainable_parameters(model)]
    assert all(g is not None and float(g.abs().sum()) > 0 for g in grads)


@pytest.mark.parametrize("targets, message", [
    (["nope"], "model.lora.target_modules: Target modules {'nope'} not found"),
    (["lm_head"], "share a tied weight with another module: lm_head"),
    (["embed_tokens"], "are not Linear layers: model.embed_tokens (Embedding)"),
])
def test_bad_targets_are_config_errors(tiny_qwen3_path, targets, message):
    with pytest.raises(ConfigError) as info:
        apply_lora(load_model(tiny_qwen3_path), LoraConfig(target_modules=targets))
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_engine_state_dict_is_the_merge_under_base_names(tiny_qwen3_path, dtype):
    model = lora_model(tiny_qwen3_path, dtype=dtype)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    merged = lora.engine_state_dict(model)
    plain = load_model(tiny_qwen3_path, dtype=dtype)
    assert merged.keys() == plain.state_dict().keys()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # the model is untouched
    reference = peft_merged(model)
    adapted = {f"model.layers.{i}.self_attn.{m}.weight" for i in range(2) for m in ("q_proj", "v_proj")}
    for name, value in merged.items():
        assert value.dtype == plain.state_dict()[name].dtype
        if name in adapted:
            assert not torch.equal(value, plain.state_dict()[name])
            torch.testing.assert_close(value, reference[name], rtol=0, atol=1e-2 if dtype == "bfloat16" else 1e-6)
        else:  # not copied: the trained model's own storage
            assert torch.equal(value, plain.state_dict()[name])
            assert value.data_ptr() == model.state_dict()[name].data_ptr()
    if dtype == "float32":  # a plain model holding the merged weights computes what the LoRA model does
        plain.load_state_dict(merged)
        ids = torch.arange(100, 120)[None]
        with torch.no_grad():
            torch.testing.assert_close(plain(input_ids=ids).logits, model(input_ids=ids).logits, rtol=0, atol=1e-4)


def test_adapter_checkpoint_round_trip(tiny_qwen3_path, tmp_path):
    from toolrl.model_sources import load_tokenizer
    from toolrl.processes.trainer_rank import TrainerRank
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    cfg = load_config(TINY, ["model.lora={r: 8, alpha: 16, target_modules: [q_proj, v_proj]}"])
    tokenizer = load_tokenizer(tiny_qwen3_path)
    rank = TrainerRank(cfg)
    rank.setup(model=lora_model(tiny_qwen3_path, seed=1), tokenizer=tokenizer)
    rank.save(str(tmp_path / "ckpt"))
    dcp_to_torch_save(str(tmp_path / "ckpt"), str(tmp_path / "ckpt.pt"))
    saved = torch.load(tmp_path / "ckpt.pt", weights_only=False)["model"]
    assert saved and all("lora_" in k for k in saved)  # adapters only: the base comes from model.source
    fresh = TrainerRank(cfg)
    fresh.setup(model=apply_lora(load_model(tiny_qwen3_path), QV), tokenizer=tokenizer)
    fresh.load(str(tmp_path / "ckpt"))
    want, got = lora.engine_state_dict(rank.model), lora.engine_state_dict(fresh.model)
    assert all(torch.equal(want[k], got[k]) for k in want)
    with pytest.raises(KeyError, match="missing"):
        lora.load_trainable_state_dict(fresh.model, dict(list(saved.items())[1:]))


def test_saved_adapter_loads_in_peft(tiny_qwen3_path, tmp_path):
    from peft import PeftModel

    model = lora_model(tiny_qwen3_path, seed=2)
    out = lora.save_adapter(model, tmp_path / "adapter", base_model=tiny_qwen3_path)
    assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == tiny_qwen3_path
    loaded = PeftModel.from_pretrained(load_model(tiny_qwen3_path), str(out))
    ids = torch.arange(100, 120)[None]
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits, rtol=0, atol=1e-5)


class EvenTokens:
    """Share of even token ids in the response: different for almost every sample, so GRPO has
    non-zero advantages on a random model."""

    name = "even_tokens"

    def __call__(self, response, ground_truth, **info):
        ids = info["response_ids"]
        return sum(t % 2 == 0 for t in ids) / max(len(ids), 1)


async def test_a_step_trains_only_adapters_and_the_engine_gets_them(tmp_path):
    from toolrl.engines import SamplingParams
    from toolrl.processes.controller import batch_for_step
    from toolrl.processes.in_process import build_local_run
    from toolrl.rollout import run_rollouts
    from toolrl.training.step import StepOptions, train_step

    registry = get_plugins().registry
    if not registry.has("reward_functions", "even_tokens"):
        registry.add(Part("reward_functions", "even_tokens", "tests", EvenTokens))
    cfg = load_config(TINY, [
        "model.lora={r: 8, alpha: 16, target_modules: [q_proj, v_proj]}", "optim.lr=0.05", "tools.entries=[]",
        "reward.functions=[{name: even_tokens}]", "rollout.max_new_tokens=6", "rollout.max_response_tokens=6",
        f"trainer.output_dir={tmp_path}"])
    run = await build_local_run(cfg)
    try:
        model = run.model
        assert run.engine.model is not model  # the engine holds a base model of its own, with the run's adapters
        assert {k for k in run.engine.model.state_dict() if "lora_" in k} == set(lora.trainable_state_dict(model))
        base = {k: v.clone() for k, v in model.state_dict().items() if "lora_" not in k}
        adapters = {k: v.clone() for k, v in lora.trainable_state_dict(model).items()}
        optimizer = torch.optim.AdamW(lora.trainable_parameters(model), lr=cfg.optim.lr)
        assert sum(len(g["params"]) for g in optimizer.param_groups) == 8

        text = run.tokenizer.apply_chat_template([{"role": "user", "content": "What is 2+3?"}],
                                                 add_generation_prompt=True, tokenize=False)
        probe = run.tokenizer.encode(text, add_special_tokens=False)
        params = SamplingParams(temperature=1.0, max_new_tokens=8, seed=11)
        first = (await run.engine.generate(probe, params))[0]

        prompts = batch_for_step(run.samples, 0, cfg.data.batch_size, cfg.trainer.seed, cfg.data.shuffle)
        trajs = await run_rollouts(run.ctx, prompts, cfg.rollout.n, seed=cfg.rollout.seed)
        options = StepOptions(cfg.algorithm, cfg.optim, pad_id=run.tokenizer.pad_token_id,
                              temperature=cfg.rollout.temperature, max_response_tokens=cfg.rollout.max_response_tokens)
        stats = train_step(model, optimizer, trajs, options)
        assert stats["grad_norm"] > 0
        assert all(torch.equal(base[k], v) for k, v in model.state_dict().items() if "lora_" not in k)
        assert all(not torch.equal(adapters[k], v) for k, v in lora.trainable_state_dict(model).items()
                   if "lora_B" in k)

        run.engine.update_weights(dict(lora.iter_adapter_weights(model)))  # what a sync sends: the adapters
        second = (await run.engine.generate(probe, params))[0]
        assert abs(second.logprobs[0] - first.logprobs[0]) > 1e-3  # the rollouts moved with the adapters
        # ... to exactly what the trainer's LoRA model computes for the same tokens.
        ids = torch.tensor([probe + second.token_ids])
        model.eval()
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
        trainer_lp = [float(logp[len(probe) - 1 + i, t]) for i, t in enumerate(second.token_ids)]
        torch.testing.assert_close(torch.tensor(second.logprobs), torch.tensor(trainer_lp), rtol=0, atol=1e-4)
    finally:
        await run.rollouts.close()


# On Ray (the rollout worker's engine gets the adapters through the object store): test_sharded_training's
# test_a_lora_run_on_ray_samples_with_the_adapters_each_step_trained, on that module's Ray cluster.
def test_cli_trains_two_steps_with_lora(tmp_path):
    # `toolrl train` in this process (click's runner): the same command, without an interpreter's start.
    res = CliRunner().invoke(cli, ["train", TINY, "model.lora={r: 8, alpha: 16, target_modules: [q_proj, v_proj]}",
                                   "trainer.total_steps=2", "optim.lr=0.05", f"trainer.output_dir={tmp_path}",
                                   "trainer.plot=false", "reward.functions=[{name: format, options: {pattern: e}}]",
                                   "rollout.max_new_tokens=4", "rollout.max_response_tokens=4"])
    assert res.exit_code == 0 and res.exception is None, (res.exception, res.stderr[-2000:])
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["grad_norm"] > 0  # step 1 moved the adapters ...
    assert rows[1]["lp_mismatch"] < 1e-4  # ... and step 2's engine sampled with them, merged
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(str(tmp_path / "checkpoints" / "step_000002"), str(tmp_path / "ckpt.pt"))
    saved = torch.load(tmp_path / "ckpt.pt", weights_only=False)["model"]
    assert len(saved) == 8 and all("lora_" in k for k in saved)
    # Export merges the adapters into the base weights: the exported plain model computes what the
    # trained adapter model computes (peft's own, unmerged forward).
    from transformers import AutoModelForCausalLM

    # `toolrl export` in this process too.
    res = CliRunner().invoke(cli, ["export", str(tmp_path), str(tmp_path / "hf")])
    assert res.exit_code == 0 and res.exception is None, (res.exception, res.stderr[-2000:])
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert not has_lora(exported)
    config = json.loads((tmp_path / "config.json").read_text())
    from toolrl.config import Config
    from toolrl.model_sources import model_path

    trained = apply_lora(load_model(model_path(Config.model_validate(config))), QV)
    lora.load_trainable_state_dict(trained, saved)
    base = load_model(model_path(Config.model_validate(config)))
    name = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(exported.state_dict()[name], base.state_dict()[name])
    ids = torch.tensor([[151644, 872, 198, 17, 10, 18, 28, 30, 151645]])
    with torch.no_grad():
        torch.testing.assert_close(exported(input_ids=ids).logits, trained.eval()(input_ids=ids).logits,
                                   rtol=1e-5, atol=1e-5)


def _fsdp_worker(rank: int, world: int, path: str, port: int, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        model = lora_model(path)
        mesh = init_device_mesh("cpu", (world,))
        for layer in model.model.layers:  # one FSDP2 unit per decoder layer, then the root
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        assert all(isinstance(p, DTensor) for p in model.parameters())
        _train_step(model, ranks=[rank])
        sharded = lora.trainable_state_dict(model)
        assert all(isinstance(v, DTensor) for v in sharded.values())
        torch.save({"engine": lora.engine_state_dict(model), "trainable": sorted(sharded)}, f"{out}/{rank}.pt")
    finally:
        dist.destroy_process_group()


def _train_step(model: torch.nn.Module, ranks: list[int]) -> None:
    """One AdamW step on the mean loss over each rank's micro-batch."""
    opt = torch.optim.AdamW(lora.trainable_parameters(model), lr=0.05)
    model.train()
    for r in ranks:
        ids = torch.arange(12).reshape(2, 6) + 100 * (r + 1)
        (model(input_ids=ids, labels=ids).loss / len(ranks)).backward()
    opt.step()


@pytest.mark.slow
def test_fsdp2_shards_a_lora_model_per_decoder_layer(tiny_qwen3_path, tmp_path):
    import socket

    from _processes import start_ranks

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start_ranks(_fsdp_worker, (2, tiny_qwen3_path, port, str(tmp_path)), nprocs=2)
    got = [torch.load(tmp_path / f"{r}.pt") for r in range(2)]
    reference = lora_model(tiny_qwen3_path)  # one process, both micro-batches: what 2 ranks must match
    _train_step(reference, ranks=[0, 1])
    want = lora.engine_state_dict(reference)
    for g in got:
        assert g["trainable"] == sorted(lora.trainable_state_dict(reference))
        assert g["engine"].keys() == want.keys()
        for k, v in want.items():
            torch.testing.assert_close(g["engine"][k], v, rtol=0, atol=1e-6)
