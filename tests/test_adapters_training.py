"""Several policies as LoRA adapters on one base (model.adapters), the trainer's side: each row trains its
role's adapter in the same step; an adapter no row used keeps its weights and optimizer state bit for bit;
checkpoints, resume and export hold every adapter."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from toolrl.config import AlgorithmConfig, ConfigError, OptimConfig, load_config
from toolrl.modeling.adapters import adapter_of, apply_adapters, has_lora
from toolrl.training import lora
from toolrl.training.step import StepOptions, train_step
from toolrl.trajectory import Trajectory

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "examples" / "tiny.yaml")
# a and b trained (b at its own lr), c frozen: a fixed opponent.
ADAPTERS = ("model.adapters={a: {r: 4, target_modules: [q_proj, v_proj]}, "
            "b: {r: 8, alpha: 16, target_modules: [q_proj, v_proj, down_proj], lr: 0.02}, "
            "c: {r: 4, target_modules: [q_proj], frozen: true}}")
PROMPT = list(range(1000, 1040))  # 40 tokens: over prefix_tree.MIN_SHARED_TOKENS, so groups share it


def rows(role: str, group: int, n: int = 4) -> list[Trajectory]:
    """A group of ``n`` pieces sampled by ``role`` from one prompt, rewards that differ (GRPO advantages ≠ 0)."""
    return [Trajectory(trajectory_id=f"{role}{group}-{i}", sample_index=i, group=group, role=role,
                       prompt_ids=PROMPT, response_ids=[2000 + 7 * i + j for j in range(3 + i)],
                       response_mask=[1] * (3 + i), logprobs=[-11.9] * (3 + i), reward=float(i % 3))
            for i in range(n)]


def trainer(*overrides: str):
    from toolrl.processes.trainer_rank import TrainerRank

    cfg = load_config(TINY, [ADAPTERS, "optim.lr=0.05", "optim.weight_decay=0.1", "optim.grad_clip=0.5",
                             "optim.eps=1e-6", *overrides])
    rank = TrainerRank(cfg)
    rank.setup()
    return rank


def adapter_state(rank, adapter: str) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
    """Adapter ``adapter``'s tensors and their optimizer state (exp_avg, exp_avg_sq, step), cloned."""
    weights, state = {}, {}
    for name, p in rank.model.named_parameters():
        if adapter_of(name) == adapter:
            weights[name] = p.detach().clone()
            state[name] = {k: v.clone() for k, v in rank.optimizer.state.get(p, {}).items()}
    return weights, state


def assert_same(before, after) -> None:
    (w0, s0), (w1, s1) = before, after
    assert w0 and w0.keys() == w1.keys() and s0.keys() == s1.keys()
    assert all(torch.equal(w0[k], w1[k]) for k in w0)
    assert all(s0[k].keys() == s1[k].keys() and all(torch.equal(s0[k][x], s1[k][x]) for x in s0[k]) for k in s0)


def test_an_adapter_no_row_used_keeps_weights_and_optimizer_state():
    rank = trainer()
    groups = {g["lr"]: [id(p) for p in g["params"]] for g in rank.optimizer.param_groups}
    assert sorted(groups) == [0.02, 0.05]  # a at optim.lr, b at its own; c (frozen) in no group
    assert {g["eps"] for g in rank.optimizer.param_groups} == {1e-6}  # optim.eps reaches AdamW
    frozen = adapter_state(rank, "c")
    assert not frozen[1]["model.layers.0.self_attn.q_proj.lora_A.c.weight"]
    untouched = adapter_state(rank, "b")
    rank.step(rows("a", 0))  # only a's rows: b (weight decay, clipping and all) and c stay as they were
    assert_same(untouched, adapter_state(rank, "b"))
    b_trained = rank.step(rows("b", 1) + rows("a", 0))
    assert b_trained["grad_norm"] > 0
    after_b = adapter_state(rank, "b")
    assert not torch.equal(next(iter(untouched[0].values())), next(iter(after_b[0].values())))
    assert {int(s["step"]) for s in after_b[1].values()} == {1}
    a_before = adapter_state(rank, "a")
    rank.step(rows("a", 2))  # b trained in the step before, none of its rows in this one
    assert_same(after_b, adapter_state(rank, "b"))
    assert all(not torch.equal(a_before[0][k], v) for k, v in adapter_state(rank, "a")[0].items())
    assert_same(frozen, adapter_state(rank, "c"))


def test_a_frozen_roles_pieces_act_but_never_train():
    """A fixed opponent's pieces are in the batch (the rollouts give every piece its role) and train
    nothing: alone they are a step with no trained token (not a backward without a graph), beside
    another role's they leave its step as it would be without them."""
    rank = trainer()
    before = {adapter: adapter_state(rank, adapter) for adapter in "abc"}
    alone = rank.step(rows("c", 1))
    assert alone["trained_tokens"] == 0
    for adapter in "abc":
        assert_same(before[adapter], adapter_state(rank, adapter))
    beside = rank.step(rows("a", 0) + rows("c", 1))
    assert beside["trained_tokens"] == sum(len(t.response_ids) for t in rows("a", 0))
    assert_same(before["c"], adapter_state(rank, "c"))
    assert_same(before["b"], adapter_state(rank, "b"))


class Recorder(torch.optim.Optimizer):
    """Keeps each update's gradients by parameter name instead of applying them (None: no gradient)."""

    def __init__(self, model):
        self.names = {id(p): n for n, p in model.named_parameters()}
        super().__init__([p for p in model.parameters() if p.requires_grad], {})
        self.grads = []

    def step(self, closure=None):
        self.grads.append({self.names[id(p)]: None if p.grad is None else p.grad.clone()
                           for g in self.param_groups for p in g["params"]})


@pytest.fixture(scope="module")
def adapted(tiny_qwen3_path):
    """The tiny Qwen3 with adapters a, b (and c frozen), every adapter weight drawn so that A and B both
    get gradients (peft starts B at zero)."""
    from toolrl.model_sources import load_model

    cfg = load_config(TINY, [ADAPTERS])
    model = apply_adapters(load_model(tiny_qwen3_path), cfg.model.adapters)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if adapter_of(name) is not None:
                p.normal_(0, 0.05)
    return model


# Rows of both roles in one forward, or apart; under gradient checkpointing the backward runs the forward
# again, routed as the first time.
@pytest.mark.parametrize(("micro_batch_size", "checkpointing"), [(16, False), (3, False), (16, True)])
def test_one_step_with_two_roles_equals_two_single_role_steps(adapted, micro_batch_size, checkpointing):
    """Under token-mean the joint step divides by all N trained tokens, a single-role step by its own
    N_r: the joint loss is Σ_r N_r/N · loss_r and adapter r's joint gradient N_r/N times its single-role
    one. The two roles' groups share their prompt: prefix sharing must not join them (another adapter,
    another KV)."""
    a, b = rows("a", 0), rows("b", 1)
    options = StepOptions(AlgorithmConfig(loss_agg="token-mean"),
                          OptimConfig(grad_clip=1e9, micro_batch_size=micro_batch_size, share_prefixes=True),
                          pad_id=0, temperature=1.0, max_response_tokens=16, adapters=("a", "b", "c"))

    def step(trajs):
        model = copy.deepcopy(adapted)
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        opt = Recorder(model)
        return train_step(model, opt, copy.deepcopy(trajs), options), opt.grads[0]

    joint, joint_grads = step(a + b)
    tokens = {role: sum(len(t.response_ids) for t in trajs) for role, trajs in (("a", a), ("b", b))}
    total = sum(tokens.values())
    assert joint["prefix_share"] > 0.3  # each role's group shares its prompt
    combined = 0.0
    for role, trajs in (("a", a), ("b", b)):
        single, single_grads = step(trajs)
        combined += tokens[role] / total * single["loss"]
        for name, g in joint_grads.items():
            owner = adapter_of(name)
            assert (single_grads[name] is None) == (owner != role)  # the other adapter takes no part
            assert g is not None
            if owner == role:
                assert float((g - tokens[role] / total * single_grads[name]).abs().max()) <= 1e-6
    assert abs(joint["loss"] - combined) <= 1e-6
    assert not any(adapter_of(n) == "c" for n in joint_grads)  # frozen: not even in the optimizer


def test_a_piece_without_an_adapter_is_refused(adapted):
    options = StepOptions(AlgorithmConfig(), OptimConfig(), pad_id=0, temperature=1.0, max_response_tokens=16,
                          adapters=("a", "b", "c"))
    for role in (None, "judge"):
        trajs = rows("a", 0)
        trajs[1].role = role
        with pytest.raises(ValueError, match=f"trajectory 'a0-1' has role {role!r}, which names no adapter"):
            train_step(copy.deepcopy(adapted), Recorder(adapted), trajs, options)


def test_checkpoint_and_resume_restore_every_adapter_and_optimizer_state(tmp_path):
    rank = trainer()
    rank.step(rows("a", 0) + rows("b", 1))
    rank.save(str(tmp_path / "ckpt"))
    fresh = trainer()
    with torch.no_grad():  # whatever the fresh rank drew, the checkpoint's values replace
        for name, p in fresh.model.named_parameters():
            if adapter_of(name) is not None:
                p.add_(1.0)
    fresh.load(str(tmp_path / "ckpt"))
    for adapter in ("a", "b", "c"):
        assert_same(adapter_state(rank, adapter), adapter_state(fresh, adapter))
    assert [g["lr"] for g in fresh.optimizer.param_groups] == [0.05, 0.02]
    # The resumed rank goes on as the first one does, bit for bit.
    for r in (rank, fresh):
        r.step(rows("b", 2))
    for adapter in ("a", "b", "c"):
        assert_same(adapter_state(rank, adapter), adapter_state(fresh, adapter))


def test_export_writes_a_merged_model_and_a_peft_adapter_per_role(tmp_path, tiny_qwen3_path):
    from peft import PeftModel
    from toolrl.model_sources import load_model
    from toolrl.modeling.adapter_routing import routed
    from toolrl.run_dir import HF_FILES, META
    from toolrl.training.export import export, save_model_files
    from transformers import AutoModelForCausalLM

    rank = trainer()
    rank.step(rows("a", 0) + rows("b", 1))
    run = tmp_path / "run"
    ckpt = run / "checkpoints" / "step_000001"
    rank.save(str(ckpt))
    (ckpt / META).write_text(json.dumps({"step": 1}))
    save_model_files(tiny_qwen3_path, run / "checkpoints" / HF_FILES)
    (run / "config.json").write_text(rank.config.model_dump_json())
    out = export(run, tmp_path / "out")
    assert sorted(p.name for p in out.iterdir()) == ["a", "b", "c"]
    ids = torch.tensor([[151644, 872, 198, 17, 10, 18, 28, 30, 151645]])
    base = load_model(tiny_qwen3_path)
    for i, role in enumerate(("a", "b", "c")):
        merged = AutoModelForCausalLM.from_pretrained(out / role).eval()
        assert not has_lora(merged)
        with torch.no_grad(), routed(rank.model, torch.full_like(ids, i)):
            want = rank.model(input_ids=ids).logits
        with torch.no_grad():
            torch.testing.assert_close(merged(input_ids=ids).logits, want, rtol=1e-5, atol=1e-5)
            peft = PeftModel.from_pretrained(copy.deepcopy(base), out / role / "adapter").eval()
            torch.testing.assert_close(peft(input_ids=ids).logits, want, rtol=1e-5, atol=1e-5)
    assert json.loads((out / "c" / "adapter" / "adapter_config.json").read_text())["target_modules"] == ["q_proj"]


def test_run_check_refuses_what_several_policies_cannot_train_with(tiny_qwen3_path, qwen3_tokenizer):
    from toolrl.plugins.parts import RunFacts
    from toolrl.processes.run_check import check_adapters

    def check(*overrides: str, trains: bool = True) -> None:
        config = load_config(TINY, list(overrides))
        check_adapters(RunFacts(config, tiny_qwen3_path, {}, {}, qwen3_tokenizer, None), trains)

    check(ADAPTERS)
    with pytest.raises(ConfigError, match=r"^override model.adapters=.*: model.adapters.b.target_modules: "):
        check("model.adapters={a: {r: 4}, b: {r: 4, target_modules: [nothing_here]}}")
    frozen = "model.adapters={a: {frozen: true}, b: {frozen: true}}"
    with pytest.raises(ConfigError, match=r"model.adapters: every policy is frozen \(a, b\): nothing to train$"):
        check(frozen)
    check(frozen, trains=False)  # an evaluation of fixed policies
    with pytest.raises(ConfigError, match=r"^override critic={}: critic: not with model.adapters: a critic \(algorithm.advantage=gae"):
        check(ADAPTERS, "algorithm.advantage=gae", "critic={}")
    with pytest.raises(ConfigError, match=r"trainer.sequence_parallel: not with model.adapters"):
        check(ADAPTERS, "trainer.world_size=2", "trainer.sequence_parallel=2", "ray.address=local")
    with pytest.raises(ConfigError, match=r"trainer.world_size: not with model.adapters"):
        check(ADAPTERS, "trainer.world_size=2", "ray.address=local")


def test_weight_sync_sends_only_the_trained_adapters_that_changed():
    from toolrl.processes.resolve import run_plan
    from toolrl.training.weight_sync import Delta, _owned_weights

    rank = trainer()
    plan = run_plan(rank.config).sync
    assert plan.adapters and plan.delta and plan.policies == ("a", "b")
    with pytest.raises(ConfigError, match=r"model.adapters: several policies need an engine that serves LoRA"):
        run_plan(load_config(TINY, [ADAPTERS, "engine.name=scripted"]))
    delta = Delta()

    def synced() -> set[str]:
        sent = {adapter_of(name) for name, *_ in _owned_weights(rank.model, 0, 1, plan, delta)}
        delta.commit()
        return sent

    assert synced() == {"a", "b"}  # new receivers: every trained adapter; the frozen one never
    assert synced() == set()
    rank.step(rows("a", 0))
    assert synced() == {"a"}
    rank.step(rows("a", 0) + rows("b", 1))
    assert synced() == {"a", "b"}


async def test_the_engine_gets_only_the_trained_adapters_that_changed(tmp_path):
    from toolrl.processes.in_process import build_local_run
    from toolrl.processes.trainer_rank import TrainerRank

    prompts = tmp_path / "prompts.jsonl"  # rows that start episodes with a and with b: both roles act
    prompts.write_text("".join(f'{{"prompt": [{{"role": "user", "content": "{q}"}}], "extra_info": {{"role": "{r}"}}}}\n'
                               for q, r in (("1+1?", "a"), ("2+2?", "b"))))
    cfg = load_config(TINY, [ADAPTERS, "optim.lr=0.05", f"trainer.output_dir={tmp_path}", "env=null",
                             f"data.train_files=[{prompts}]"])
    run = await build_local_run(cfg)
    try:
        rank = TrainerRank(cfg)
        rank.setup(model=run.model, tokenizer=run.tokenizer)
        engine = run.engine.model
        assert engine is not run.model  # a base model of its own, given the run's adapters by name

        def held() -> dict[str, torch.Tensor]:
            return {k: v.clone() for k, v in engine.state_dict().items() if adapter_of(k) is not None}

        frozen = {k: v for k, v in held().items() if adapter_of(k) == "c"}
        assert frozen and held().keys() == lora.trainable_state_dict(run.model).keys()
        rank.step(rows("a", 0) + rows("b", 1))
        rank.push_to_engines([run.engine])
        trainer = run.model.state_dict()
        after = held()
        assert all(torch.equal(after[k], trainer[k]) for k in after if adapter_of(k) in ("a", "b"))
        assert all(torch.equal(after[k], v) for k, v in frozen.items())  # never sent: lora_B zero on both sides
        rank.step(rows("a", 2))
        versions = {k: v._version for k, v in engine.state_dict().items() if adapter_of(k) is not None}
        rank.push_to_engines([run.engine])
        written = {adapter_of(k) for k, v in engine.state_dict().items() if k in versions
                   and v._version != versions[k]}
        assert written == {"a"}  # b did not change since the last sync: not sent again
    finally:
        await run.rollouts.close()


# The default tests above fail first when a part breaks (resume, export, the engine's syncs); this one runs
# them together through the CLI (42 s here).
@pytest.mark.long
def test_cli_trains_resumes_and_exports_several_policies(tmp_path, tiny_qwen3_path):
    """Recorded pieces of two roles through `toolrl train` (the controller, the in-process engine's syncs),
    `--resume` and `toolrl export`."""
    from _dists import run_toolrl
    from safetensors.torch import load_file

    data = tmp_path / "rows.jsonl"
    data.write_text("".join(t.model_dump_json() + "\n" for g, role in enumerate("abab") for t in rows(role, g)))
    args = ["train", TINY, f"data.trajectories=[{data}]", ADAPTERS, "optim.lr=0.05", f"trainer.output_dir={tmp_path / 'run'}",
            "trainer.plot=false"]
    env = {"OMP_NUM_THREADS": "1"}
    res = run_toolrl(*args, "trainer.total_steps=2", env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    res = run_toolrl(*args, "trainer.total_steps=3", "--resume", env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in metrics] == [1, 2, 3] and all(r["grad_norm"] > 0 for r in metrics)
    res = run_toolrl("export", str(tmp_path / "run"), str(tmp_path / "out"), env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    name = "model.layers.0.self_attn.q_proj.weight"
    base = load_file(next(Path(tiny_qwen3_path).glob("*.safetensors")))[name]
    merged = {role: load_file(tmp_path / "out" / role / "model.safetensors")[name] for role in "abc"}
    assert torch.equal(merged["c"], base)  # frozen: peft's lora_B = 0, the base model
    assert not torch.equal(merged["a"], base) and not torch.equal(merged["b"], merged["a"])
    assert all((tmp_path / "out" / role / "adapter" / "adapter_model.safetensors").is_file() for role in "abc")
