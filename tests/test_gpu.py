"""The GPU path, on a CUDA machine (skipped where there is none: CI has no GPU): `toolrl train` on the
device in float32 and in bfloat16, with resume; FSDP2 with the GPU mixed-precision policy (bf16 compute,
fp32 parameters and gradient reduction) over an NCCL process group; a sharded checkpoint written and read
back on the device; the tiny vision-language model's packed forward with images and a bf16 GRPO step."""

from __future__ import annotations

import json
import math
import queue as queue_module
import socket
from pathlib import Path

import pytest
import torch
from _dists import EVEN_TOKENS, make_dist, run_toolrl

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "examples" / "tiny.yaml")


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


@pytest.fixture(scope="module")
def even_tokens(tmp_path_factory) -> Path:
    """A directory holding a plugin whose reward differs between trajectories (a random model's
    arithmetic rewards are all 0: no gradient)."""
    root = tmp_path_factory.mktemp("plugin")
    make_dist(root, "even-tokens", "even", "even_tokens_plugin", EVEN_TOKENS)
    return root


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cli_trains_and_resumes_on_the_gpu(tmp_path, even_tokens, dtype):
    out = tmp_path / "run"
    args = ("model.device=cuda", f"model.dtype={dtype}", f"trainer.output_dir={out}", "trainer.plot=false",
            "reward.functions=[{name: even_tokens}]", "optim.lr=1e-3")
    first = run_toolrl("train", TINY, "trainer.total_steps=2", *args, path=even_tokens, timeout=900)
    assert first.returncode == 0, first.stderr[-3000:]
    resumed = run_toolrl("train", TINY, "trainer.total_steps=3", "--resume", *args, path=even_tokens, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    metrics = lines(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3]
    for m in metrics:
        print(f"{dtype} step {m['step']}: lp_mismatch {m['lp_mismatch']:.2e}, loss {m['loss']:.4f}, "
              f"grad_norm {m['grad_norm']:.3f}, tokens/s {m['tokens_per_s']:.0f}, "
              f"trainer peak MB {m['trainer_peak_mb']:.0f}")
        assert math.isfinite(m["loss"]) and m["grad_norm"] > 0 and math.isfinite(m["grad_norm"])
    # Engine and trainer share the module: fp32 agrees to rounding; bf16 differs by its kernels' rounding.
    assert max(m["lp_mismatch"] for m in metrics) < (1e-3 if dtype == "float32" else 0.1)


def _batch(vocab: int):
    from toolrl.trajectory import Trajectory

    g = torch.Generator().manual_seed(0)
    trajs = []
    for i in range(8):
        prompt = torch.randint(100, vocab, (48,), generator=g).tolist()
        n = 24 + 8 * i
        response = torch.randint(100, vocab, (n,), generator=g).tolist()
        mask = [0 if 10 <= j < 16 else 1 for j in range(n)]  # a tool result in the middle
        trajs.append(Trajectory(trajectory_id=f"t{i}", sample_index=i // 4, group=i // 4, prompt_ids=prompt,
                                response_ids=response, response_mask=mask,
                                logprobs=[-11.9 * m for m in mask], reward=float(i % 3 == 0)))
    return trajs


def _options():
    from toolrl.config import AlgorithmConfig, OptimConfig
    from toolrl.training.step import StepOptions

    return StepOptions(AlgorithmConfig(), OptimConfig(lr=1e-3, micro_batch_size=4), pad_id=0, temperature=1.0,
                       max_response_tokens=128)


def _sharded_rank(port: int, path: str, ckpt: str, queue) -> None:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from toolrl.model_sources import load_model
    from toolrl.training.sharding import shard
    from toolrl.training.step import train_step
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        torch.cuda.set_device(0)
        model = load_model(path, device="cuda")
        policy = shard(model, init_device_mesh("cuda", (1,)))
        seen: list[torch.dtype] = []
        model.model.layers[0].mlp.register_forward_hook(lambda m, a, out: seen.append(out.dtype))
        optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
        out = train_step(policy, optimizer, _batch(model.config.vocab_size), _options())
        params = {p.dtype for p in policy.parameters()}
        state = get_model_state_dict(policy)
        dcp.save(state, checkpoint_id=ckpt)
        restored = {k: torch.zeros_like(v) for k, v in state.items()}
        dcp.load(restored, checkpoint_id=ckpt)
        same = all(torch.equal(restored[k].full_tensor(), v.full_tensor()) for k, v in state.items())
        queue.put({"loss": out["loss"], "grad_norm": out["grad_norm"], "compute": str(seen[0]),
                   "params": sorted(str(d) for d in params), "checkpoint_round_trip": same})
    finally:
        dist.destroy_process_group()


def test_fsdp2_over_nccl_computes_in_bf16_and_matches_fp32(tiny_qwen3_path, tmp_path):
    import torch.multiprocessing as mp
    from toolrl.model_sources import load_model
    from toolrl.training.step import train_step

    model = load_model(tiny_qwen3_path, device="cuda")
    reference = train_step(model, torch.optim.AdamW(model.parameters(), lr=1e-3), _batch(model.config.vocab_size),
                          _options())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_sharded_rank, args=(port, tiny_qwen3_path, str(tmp_path / "ckpt"), queue))
    proc.start()
    got = None
    while got is None:  # the rank's answer, or its death (its traceback is on stderr)
        try:
            got = queue.get(timeout=1)
        except queue_module.Empty:
            if not proc.is_alive():
                break
    proc.join(60)
    assert proc.exitcode == 0 and got is not None
    print(f"fp32 module: loss {reference['loss']:.6f} grad_norm {reference['grad_norm']:.6f}; "
          f"FSDP2/NCCL bf16 compute: loss {got['loss']:.6f} grad_norm {got['grad_norm']:.6f}")
    assert got["compute"] == "torch.bfloat16" and got["params"] == ["torch.float32"]
    assert got["checkpoint_round_trip"]
    assert got["loss"] == pytest.approx(reference["loss"], rel=3e-2, abs=1e-3)
    assert got["grad_norm"] == pytest.approx(reference["grad_norm"], rel=3e-2)


def test_a_vision_language_model_on_the_gpu():
    from test_vision_training import reference_logprobs
    from toolrl import model_sources
    from toolrl.training.packing import build_batch
    from toolrl.training.step import StepOptions, response_logprobs, train_step
    from vision_fixtures import image, vision_trajectory

    path = model_sources.tiny_qwen2_5_vl()
    processor = model_sources.load_processor(path)
    figure = image(100, 60)
    trajs = [vision_trajectory(processor, "a", figure, image(40, 40, 1), "x = 4", group=0, reward=1.0),
             vision_trajectory(processor, "b", figure, image(30, 50, 3), "x is 12", group=0, reward=0.0)]
    model = model_sources.load_model(path, device="cuda")
    with torch.no_grad():
        packed = response_logprobs(model, build_batch(trajs, [0.0, 0.0], "cuda", processor=processor)).cpu()
    worst = max(float((packed[i, :len(t.response_ids)] - reference_logprobs(model, processor, t)).abs().max())
                for i, t in enumerate(trajs))
    print(f"vision fp32 packed vs the model's forward: {worst:.2e}")
    assert worst <= 1e-3

    model = model_sources.load_model(path, dtype="bfloat16", device="cuda")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    options = StepOptions(_options().algo, _options().optim, pad_id=0, temperature=1.0, max_response_tokens=128,
                          processor=processor)
    out = train_step(model, torch.optim.AdamW(model.parameters(), lr=1e-3), trajs, options)
    print(f"vision bf16 step: loss {out['loss']:.4f} grad_norm {out['grad_norm']:.4f}")
    assert math.isfinite(out["loss"]) and out["grad_norm"] > 0
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert any(".visual." in n for n in moved) and any(".language_model." in n for n in moved)


async def test_static_decode_in_cuda_graphs_matches_eager_on_the_gpu(tiny_qwen3_path, windowed, qwen3_tokenizer):
    """The static decode steps, captured as CUDA graphs, against the eager path on the GPU (fp32): the
    same greedy and seeded tokens, log-probs within 1e-4, with Gemma 3's sliding window too."""
    from test_static_decode import USER_TEXTS, compare
    from toolrl.model_sources import load_model

    prompts = [qwen3_tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                                   return_dict=False) for t in USER_TEXTS]
    for module, scale in ((load_model(tiny_qwen3_path), 12.0), (windowed, 40.0)):
        static = await compare(tiny_qwen3_path, module, scale, qwen3_tokenizer, prompts, tol=1e-4, device="cuda")
        assert static._static.graphs is not None and static._static.captures > 0


def test_one_call_attention_trains_as_the_span_loop_on_the_gpu(tiny_qwen3_path, windowed, monkeypatch):
    """FlexAttention (compiled) over packed and tree rows against the loop of one sdpa call per span, on the
    GPU in fp32: the same log-probs, loss and gradients within 1e-4, Gemma 3's window included."""
    import copy

    from test_prefix_sharing import common_first_turn, shared_prompt
    from toolrl.config import AlgorithmConfig
    from toolrl.model_sources import load_model
    from toolrl.training import packing
    from toolrl.training.packing import build_batch
    from toolrl.training.step import policy_loss, response_logprobs

    def run(model, trajs, share, one_call):
        monkeypatch.setattr(packing, "one_call_attention", lambda device: one_call)
        batch = build_batch(trajs, [0.5 - 0.3 * i for i in range(len(trajs))], "cuda", share_prefixes=share)
        model.zero_grad(set_to_none=True)
        lp = response_logprobs(model, batch, chunk_size=7)
        norm = {"tokens": float(batch.response_mask.sum()), "seqs": float(len(trajs)), "max_len": 32.0}
        loss, _ = policy_loss(lp, lp.detach() + 0.01, batch, AlgorithmConfig(tis_cap=2.0), norm)
        loss.backward()
        return lp.detach(), loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    for model in (load_model(tiny_qwen3_path), copy.deepcopy(windowed)):
        model = model.to("cuda").train()
        for case in (shared_prompt, common_first_turn):
            for share in (False, True):
                (lp0, loss0, g0), (lp1, loss1, g1) = run(model, case(), share, False), run(model, case(), share, True)
                assert torch.allclose(lp1, lp0, atol=1e-4, rtol=0)
                assert abs(float(loss1 - loss0)) <= 1e-4 * abs(float(loss0))
                for name, g in g0.items():
                    assert float((g1[name] - g).norm()) <= 1e-4 * float(g.norm()) + 1e-12, name
