"""Everything one GPU can tell us in a few minutes, in one call: trainer MFU, engine decode against the
bandwidth bound (static steps in CUDA graphs against the eager path), the one-call packed attention
against the loop over spans, weight sync against the device copy floor, the tiny MoE with and without
R3, and a 3-step ``toolrl train`` end to end. Each item runs in its own process (forked from a server that
imported torch and transformers once) with its own time cap; a failed item (timeout, OOM, exception) gets a
line saying why and the suite goes on. ``DIR/gpu_suite.json`` and ``DIR/gpu_suite.md`` are rewritten after
every item, so a run killed at its limit leaves what it had.

    python benchmarks/gpu_suite.py --out DIR [--device cuda|cpu] [--smoke] [--only trainer,engine,...]

``--smoke`` (CPU, tiny shapes) checks the suite itself in well under a minute (tests/test_gpu_suite.py).
Formulas and goals: docs/gpu.md, "The GPU suite".
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import free_port

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
H100_PEAK_TFLOPS = 989.0  # bf16 dense, H100 SXM (H200 the same)
MEASURED_TFLOPS = 790.0  # a large bf16 matmul measured on these machines
CPU_PEAK_TFLOPS = 0.1  # nominal: CPU MFU figures only check the arithmetic

# Qwen3 shapes (random weights): the real hidden/MLP/layers/heads/kv-heads/head_dim, vocabulary 151936.
SHAPES: dict[str, dict[str, int]] = {
    "0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128),
    "1.7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=32),
}


@dataclass(frozen=True)
class Item:
    """One process: ``kind`` picks its child function, ``params`` its settings, ``cap_s`` its time cap."""

    name: str
    kind: str
    params: dict[str, Any] = field(default_factory=dict)
    cap_s: float = 60.0


def plan(smoke: bool) -> list[Item]:
    """The matrix: sized so the whole suite fits in 6 minutes on one H100, process starts included."""
    if smoke:
        s = dict(shape="tiny")
        # One trainer item with every option the full plan's items set (checkpointing, a group with shared
        # prefixes): each process start costs seconds, and the smoke run only shows the code runs.
        return [Item("trainer/tiny-256-group-shared-ckpt", "trainer", dict(s, tokens=256, ckpt=True, group=True,
                                                                           share=True), 60),
                Item("engine/decode-b4", "engine", dict(s, batch=4, prompt=16, new=8, decode="static"), 60),
                Item("engine/static-vs-eager", "decode_check", dict(s, batch=3, prompt=16, new=8), 60),
                Item("attention/one-call-vs-spans", "attention", dict(s, prompt=32), 120),
                Item("sync/broadcast", "sync", dict(s, transport="broadcast"), 60),
                Item("sync/shared_memory", "sync", dict(s, transport="shared_memory"), 60),
                Item("sync/object_store", "sync", dict(s, transport="object_store"), 60),
                Item("moe/r3", "moe", dict(args=["--layers", "2", "--experts", "4", "--groups", "1", "--n", "2",
                                                  "--prompt", "8", "--new", "4", "--repeats", "1"]), 90),
                Item("train/3-steps", "train", dict(overrides=["rollout.max_new_tokens=8", "data.batch_size=1",
                                                                "rollout.n=2"]), 120)]
    # The goals' items first (1.7B at 16k, shared against unshared prefixes, NCCL against the copy floor, the
    # first end-to-end run on a GPU), so a run cut short still answers them.
    # The first item touching the GPU pays the cold start: run 7's timed out at 45 s, its rerun took 31 s.
    # Each packed-row item has its span-loop anchor (``-spans``): run 7 found the one call slower than the
    # loop (its BlockMask then built through vmap), so each default is measured against the other.
    return [Item("trainer/1.7b-16k-ckpt", "trainer", dict(shape="1.7b", tokens=16384, ckpt=True), 90),
            Item("trainer/1.7b-16k-ckpt-spans", "trainer",
                 dict(shape="1.7b", tokens=16384, ckpt=True, attention="spans"), 45),
            Item("trainer/1.7b-16k-group-unshared", "trainer",
                 dict(shape="1.7b", tokens=16384, ckpt=True, group=True, share=False), 45),
            Item("trainer/1.7b-16k-group-unshared-spans", "trainer",
                 dict(shape="1.7b", tokens=16384, ckpt=True, group=True, share=False, attention="spans"), 45),
            # One attention call per layer (FlexAttention, compiled in the item: its cap allows for that),
            # then the loop of one sdpa call per span that it replaces, in the same run.
            Item("trainer/1.7b-16k-group-shared", "trainer",
                 dict(shape="1.7b", tokens=16384, ckpt=True, group=True, share=True), 120),
            Item("trainer/1.7b-16k-group-shared-spans", "trainer",
                 dict(shape="1.7b", tokens=16384, ckpt=True, group=True, share=True, attention="spans"), 45),
            Item("attention/one-call-vs-spans", "attention", dict(shape="0.6b", prompt=300), 120),
            # Static decode steps (CUDA graphs, the default on CUDA) against the eager path, same shapes.
            Item("engine/decode-b64", "engine", dict(shape="0.6b", batch=64, prompt=256, new=128), 60),
            Item("engine/decode-b64-eager", "engine", dict(shape="0.6b", batch=64, prompt=256, new=128,
                                                            decode="eager"), 60),  # run 7: over 35 s
            Item("engine/decode-b256", "engine", dict(shape="0.6b", batch=256, prompt=256, new=128), 60),
            Item("engine/static-vs-eager", "decode_check", dict(shape="0.6b", batch=16, prompt=128, new=64), 60),
            Item("sync/broadcast", "sync", dict(shape="0.6b", transport="broadcast"), 30),
            # Run 1 took 28 s (opening the link: 13.6 s of it); run 3 timed out at a cap of 30.
            Item("sync/shared_memory", "sync", dict(shape="0.6b", transport="shared_memory"), 60),
            Item("sync/object_store", "sync", dict(shape="0.6b", transport="object_store"), 30),
            Item("train/3-steps", "train", dict(overrides=[
                "model.tiny={hidden_size: 1024, intermediate_size: 3072, num_hidden_layers: 28, "
                "num_attention_heads: 16, num_key_value_heads: 8, head_dim: 128}",
                "data.batch_size=8", "rollout.n=8", "rollout.max_new_tokens=128", "rollout.max_response_tokens=512",
                "engine.max_batch_size=64"]), 100),
            Item("trainer/1.7b-16k-nockpt", "trainer", dict(shape="1.7b", tokens=16384, ckpt=False), 40),
            Item("trainer/0.6b-8k-ckpt", "trainer", dict(shape="0.6b", tokens=8192, ckpt=True), 35),
            Item("trainer/0.6b-16k-ckpt", "trainer", dict(shape="0.6b", tokens=16384, ckpt=True), 35),
            Item("trainer/0.6b-32k-ckpt", "trainer", dict(shape="0.6b", tokens=32768, ckpt=True), 40),
            Item("moe/r3", "moe", dict(args=["--quick", "--repeats", "2"]), 100)]


# ---- shared helpers (run in the children) ----------------------------------------------------------

def sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def qwen3(shape: str, device: str, dtype: Any) -> Any:
    """A random Qwen3 of ``shape`` built straight on ``device`` (no file: a 1.7B model saves in seconds
    it does not need to spend), sdpa attention."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=151936, max_position_embeddings=40960, tie_word_embeddings=True,
                         attn_implementation="sdpa", **SHAPES[shape])
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(config)
    return model.to(dtype)


def profiled(name: str, out: Path | None, fn: Any) -> Any:
    """``fn()`` under torch's profiler when ``out`` is set (``--profile``): the 25 costliest ops by device
    time (CPU time on a CPU) to ``out/profile_NAME.txt``."""
    if out is None:
        return fn()
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    with profile(activities=activities) as prof:
        result = fn()
    table = prof.key_averages().table(sort_by="cuda_time_total" if cuda else "cpu_time_total", row_limit=25)
    (out / f"profile_{name.replace('/', '_')}.txt").write_text(table)
    return result


def peak_mb(device: str) -> float:
    import torch

    if device == "cuda":
        return torch.cuda.max_memory_allocated() / 2**20
    from toolrl.training.peakmem import rss_bytes

    return (rss_bytes() or 0) / 2**20


def copy_floor_s(nbytes: int, device: str) -> tuple[float, float]:
    """Seconds to copy ``nbytes`` device-to-device once (a big ``copy_``, best of 5) and the GB/s it
    implies (read + write counted once: bytes / s)."""
    import torch

    a = torch.empty(nbytes, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    best = float("inf")
    for _ in range(5):
        sync(device)
        t0 = time.perf_counter()
        b.copy_(a)
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return best, nbytes / best / 1e9


def _gpus() -> int:
    import torch

    return torch.cuda.device_count()


# ---- trainer step: MFU -----------------------------------------------------------------------------

def trainer_workload(tokens: int, group: bool) -> tuple[list[Any], int, int]:
    """Trajectories filling one packed row of ``tokens`` (unshared), every response token trained;
    (trajectories, causal pairs computed unshared, causal pairs computed with the prefix shared).
    ``group``: 8 samples of one prompt (3/4 of each sample), else 4 sequences of their own prompts."""
    import random

    from toolrl.trajectory import Trajectory

    rng = random.Random(0)
    n, prompt = (8, tokens // 8 * 3 // 4) if group else (4, min(512, tokens // 8))
    length = tokens // n
    shared = [rng.randrange(100, 150_000) for _ in range(prompt)]
    trajs = []
    for i in range(n):
        p = shared if group else [rng.randrange(100, 150_000) for _ in range(prompt)]
        r = length - prompt
        trajs.append(Trajectory(trajectory_id=str(i), sample_index=i, group=0 if group else i, prompt_ids=p,
                                response_ids=[rng.randrange(100, 150_000) for _ in range(r)], response_mask=[1] * r,
                                logprobs=[-1.0] * r, reward=float(i % 2)))
    r = length - prompt
    unshared = n * length * (length + 1) // 2
    shared_pairs = prompt * (prompt + 1) // 2 + n * (r * prompt + r * (r + 1) // 2)
    return trajs, unshared, shared_pairs if group else unshared


def computed_pairs(p: dict[str, Any]) -> tuple[list[Any], int, int]:
    """The workload of a trainer item and the causal pairs its step computes (the shared count only where
    the prefix is shared), beside the unshared count."""
    trajs, unshared, shared = trainer_workload(p["tokens"], p.get("group", False))
    return trajs, unshared, shared if p.get("share", False) else unshared


def trainer_child(p: dict[str, Any], device: str, profile_to: Path | None = None) -> dict[str, Any]:
    """``train_step`` as the sharded trainer runs it on a GPU: FSDP2 on a one-rank mesh (NCCL; gloo on
    CPU), bf16 compute with fp32 parameters, gradients and AdamW state on CUDA."""
    import torch
    import torch.distributed as dist
    from toolrl.config import AlgorithmConfig, OptimConfig
    from toolrl.training.sharding import shard
    from toolrl.training.step import StepOptions, train_step
    from torch.distributed.device_mesh import init_device_mesh

    if p.get("attention") == "spans":  # the loop over spans, not the device's one call per layer
        from toolrl.training import packing

        packing.one_call_attention = lambda device: False
    backend = "nccl" if device == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        if device == "cuda":
            torch.cuda.set_device(0)
        model = qwen3(p["shape"], device, torch.float32)
        if p.get("ckpt"):
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        policy = shard(model, init_device_mesh(device, (1,)))
        optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-6)
        trajs, unshared_pairs, pairs = computed_pairs(p)
        share = p.get("share", False)
        options = StepOptions(AlgorithmConfig(), OptimConfig(micro_batch_size=len(trajs), share_prefixes=share),
                              pad_id=0, temperature=1.0, max_response_tokens=max(len(t.response_ids) for t in trajs))
        times = []
        for _ in range(3):  # a warm-up, then two timed
            sync(device)
            t0 = time.perf_counter()
            metrics = train_step(policy, optimizer, trajs, options)
            sync(device)
            times.append(time.perf_counter() - t0)
        profiled(p["name"], profile_to, lambda: (train_step(policy, optimizer, trajs, options), sync(device)))
        cfg = model.config
        total = sum(len(t.prompt_ids) + len(t.response_ids) for t in trajs)
        computed = total - (len(trajs) - 1) * len(trajs[0].prompt_ids) if share else total
        trained = sum(len(t.response_ids) for t in trajs)
        head = cfg.vocab_size * cfg.hidden_size
        body = sum(q.numel() for q in model.parameters()) - head  # tied: the embedding is the head's matrix
        attention = 12 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim * pairs
        flops = 6 * body * computed + 6 * head * trained + attention
        step = statistics.median(times[1:])
        return {"step_s": step, "tokens": total, "computed_tokens": computed, "trained_tokens": trained,
                "tokens_per_s": total / step, "flops": flops, "tflops_per_s": flops / step / 1e12,
                "body_params": body, "head_params": head, "causal_pairs": pairs, "unshared_pairs": unshared_pairs,
                "peak_mb": peak_mb(device), "loss": metrics["loss"],
                "precision": "FSDP2 one-rank mesh, MixedPrecisionPolicy(param bf16, reduce fp32), fp32 master"
                if device == "cuda" else "FSDP2 one-rank gloo mesh, fp32"}
    finally:
        dist.destroy_process_group()


# ---- engine decode ---------------------------------------------------------------------------------

def engine_child(p: dict[str, Any], device: str, profile_to: Path | None = None) -> dict[str, Any]:
    """The transformers engine decoding ``batch`` requests at once (``decode``: the engine's option, auto
    by default: static on CUDA); decode time is the run with ``new`` tokens minus the run with 2 (the same
    prefill), against bytes read per decode step / HBM bandwidth. ``device_share``: the GPU's busy time
    (kernels, from the profiler) over the wall time of one more run of 16 tokens."""
    import asyncio
    import random

    import torch
    from toolrl.engines import SamplingParams
    from toolrl.engines.transformers import TransformersEngine, TransformersEngineConfig
    from toolrl.model_sources import qwen_tokenizer

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = qwen3(p["shape"], device, dtype).eval()
    engine = TransformersEngine(model, qwen_tokenizer(), TransformersEngineConfig(
        device=device, max_batch_size=p["batch"], reuse_kv_cache=False, share_prompts=False, seed=0,
        decode=p.get("decode", "auto")))
    rng = random.Random(0)
    prompts = [[rng.randrange(100, 150_000) for _ in range(p["prompt"])] for _ in range(p["batch"])]

    def run(new: int) -> tuple[float, int]:
        async def go() -> list[Any]:
            return await asyncio.gather(*(engine.generate(q, SamplingParams(max_new_tokens=new, seed=i))
                                          for i, q in enumerate(prompts)))
        sync(device)
        t0 = time.perf_counter()
        gens = asyncio.run(go())
        sync(device)
        return time.perf_counter() - t0, sum(len(g[0].token_ids) for g in gens)

    run(2)  # warm-up
    short, short_tokens = run(2)
    long, long_tokens = run(p["new"])
    profiled(p["name"], profile_to, lambda: run(16))
    share = device_share(lambda: run(16)) if device == "cuda" else None
    decode_s, decoded = long - short, long_tokens - short_tokens
    cfg = model.config
    weights = sum(q.numel() * q.element_size() for q in model.parameters())
    context = p["prompt"] + p["new"] / 2  # mean KV length over the decode
    kv = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * dtype.itemsize * context * p["batch"]
    copy_s, bw = copy_floor_s(1 << 30 if device == "cuda" else 1 << 26, device)
    bound = p["batch"] / ((weights + kv) / (2 * bw * 1e9))  # a copy moves each byte twice: read + write
    tps = decoded / decode_s
    return {"decode_tokens_per_s": tps, "bound_tokens_per_s": bound, "ratio": tps / bound, "decode_s": decode_s,
            "decoded": decoded, "weight_bytes": weights, "kv_bytes_per_step": kv, "copy_gb_per_s": bw,
            "hbm_gb_per_s": 2 * bw, "device_share": share, "decode": "static" if engine._static else "eager",
            "graphs_captured": engine._static.captures if engine._static else 0}


def device_share(fn: Any) -> float:
    """The device's busy time (the kernels' own time, from torch's profiler) over the wall time of ``fn()``."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    busy_us = sum(e.self_device_time_total for e in prof.key_averages() if e.device_type.name == "CUDA")
    return busy_us / 1e6 / wall


def decode_check_child(p: dict[str, Any], device: str) -> dict[str, Any]:
    """The static decode step against the eager one on one model: ``batch`` prompts, half greedy and half
    sampled (seeded), ``new`` tokens each. Greedy rows must give identical tokens; sampled rows draw the
    same uniforms, so they agree while the logits do; log-probs compared over the tokens both agree on."""
    import asyncio
    import random

    import torch
    from toolrl.engines import SamplingParams
    from toolrl.engines.transformers import TransformersEngine, TransformersEngineConfig
    from toolrl.model_sources import qwen_tokenizer

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = qwen3(p["shape"], device, dtype).eval()
    rng = random.Random(0)
    prompts = [[rng.randrange(100, 150_000) for _ in range(p["prompt"] + 7 * i)] for i in range(p["batch"])]

    def generate(decode: str) -> list[Any]:
        engine = TransformersEngine(model, qwen_tokenizer(), TransformersEngineConfig(
            device=device, max_batch_size=p["batch"], reuse_kv_cache=False, seed=0, decode=decode))

        async def go() -> list[Any]:
            return await asyncio.gather(*(engine.generate(q, SamplingParams(
                temperature=0.0 if i % 2 else 1.0, max_new_tokens=p["new"], seed=i)) for i, q in enumerate(prompts)))
        return [g[0] for g in asyncio.run(go())]

    eager, static = generate("eager"), generate("static")
    same, diffs = {"greedy": 0, "sampled": 0}, []
    for i, (a, b) in enumerate(zip(eager, static, strict=True)):
        agree = next((j for j, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y), len(a.token_ids))
        same["greedy" if i % 2 else "sampled"] += agree == len(a.token_ids)
        diffs += [abs(x - y) for x, y in zip(a.logprobs[:agree], b.logprobs[:agree])]
    rows = {"greedy": p["batch"] // 2, "sampled": p["batch"] - p["batch"] // 2}
    return {"greedy_identical": f"{same['greedy']}/{rows['greedy']}",
            "sampled_identical": f"{same['sampled']}/{rows['sampled']}",
            "max_logprob_diff": max(diffs), "mean_logprob_diff": statistics.fmean(diffs),
            "dtype": str(dtype).removeprefix("torch.")}


def attention_child(p: dict[str, Any], device: str) -> dict[str, Any]:
    """One attention call per layer (FlexAttention on CUDA) against the loop over spans: a policy-loss
    backward over a tree batch (two groups of 4 sharing a ``prompt``-token prompt, two of each also a first
    turn) and an unshared one, in fp32, on the shape's Qwen3 and on a Gemma 3 of the same shape with
    sliding-window layers (a window of prompt / 5): the largest relative differences of log-probs, loss
    and gradients."""
    import random

    import torch
    from toolrl.config import AlgorithmConfig
    from toolrl.training import packing
    from toolrl.training.packing import build_batch
    from toolrl.training.step import policy_loss, response_logprobs
    from toolrl.trajectory import Trajectory
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    rng = random.Random(0)

    def ids(n: int) -> list[int]:
        return [rng.randrange(100, 150_000) for _ in range(n)]

    trajs, n = [], p["prompt"]
    for g in range(2):
        prompt, turn = ids(n), ids(n // 8)
        for i in range(4):
            response = (turn if i < 2 else []) + ids(n // 10 + n // 15 * i)
            trajs.append(Trajectory(trajectory_id=f"{g}{i}", sample_index=i, group=g, prompt_ids=prompt,
                                    response_ids=response, response_mask=[1] * len(response),
                                    logprobs=[-1.0] * len(response)))
    torch.manual_seed(0)
    shape = SHAPES[p["shape"]]
    gemma = Gemma3TextConfig(vocab_size=151936, sliding_window=n // 5, attn_implementation="sdpa",
                             layer_types=["sliding_attention", "full_attention"] * (shape["num_hidden_layers"] // 2),
                             **shape)
    with torch.device(device):
        models = {"qwen3": qwen3(p["shape"], device, torch.float32), "gemma3-window": Gemma3ForCausalLM(gemma)}

    def loss_and_grads(model: Any, share: bool, one_call: bool) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        packing.one_call_attention = lambda device: one_call
        batch = build_batch(trajs, [0.5 - 0.1 * i for i in range(len(trajs))], device, share_prefixes=share)
        model.zero_grad(set_to_none=True)
        lp = response_logprobs(model, batch, chunk_size=256)
        norm = {"tokens": float(batch.response_mask.sum()), "seqs": float(len(trajs)), "max_len": 256.0}
        loss, _ = policy_loss(lp, lp.detach() + 0.01, batch, AlgorithmConfig(), norm)
        loss.backward()
        return lp.detach(), loss.detach(), {n: q.grad.clone() for n, q in model.named_parameters() if q.grad is not None}

    out: dict[str, Any] = {}
    for name, model in models.items():
        model.train()
        for share in (False, True):
            lp0, loss0, g0 = loss_and_grads(model, share, False)
            lp1, loss1, g1 = loss_and_grads(model, share, True)
            key = f"{name}-{'tree' if share else 'packed'}"
            out[key] = max(float((lp1 - lp0).abs().max()), float((loss1 - loss0).abs() / loss0.abs()),
                           max(float((g1[n] - g).norm() / g.norm()) for n, g in g0.items() if float(g.norm()) > 0))
    return out


# ---- weight sync -----------------------------------------------------------------------------------

def sync_figures(times: list[float], nbytes: int, device: str) -> dict[str, Any]:
    """A transport's syncs of ``nbytes`` (the first opens its link): the median of the others beside the
    device copy floor for the same bytes."""
    floor, bw = copy_floor_s(nbytes, device)
    s = statistics.median(times[1:])
    return {"sync_s": s, "bytes": nbytes, "copy_floor_s": floor, "ratio": s / floor, "copy_gb_per_s": bw,
            "first_s": times[0]}


def sync_receiver(transport_name: str, shape: str, device: str, link_json: str, out: Any) -> None:
    """The engine side, in a process of its own: a transformers engine whose weights the link writes."""
    import torch
    from toolrl.engines.transformers import TransformersEngine, TransformersEngineConfig
    from toolrl.model_sources import qwen_tokenizer
    from toolrl.transports import Link
    from toolrl.transports.weight_rows import receive_into

    if device == "cuda":
        torch.cuda.set_device(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    engine = TransformersEngine(qwen3(shape, device, dtype).eval(), qwen_tokenizer(),
                                TransformersEngineConfig(device=device))
    receiver = transport(transport_name, device).open_receiver(Link.model_validate_json(link_json), 0)
    for version in range(3):
        sync(device)
        t0 = time.perf_counter()
        receive_into(engine, [receiver], version)
        sync(device)
        out.put(time.perf_counter() - t0)
    receiver.close()


def transport(name: str, device: str) -> Any:
    from toolrl.transports.broadcast import BroadcastOptions, BroadcastTransport
    from toolrl.transports.shared_memory import SharedMemoryTransport

    return BroadcastTransport(BroadcastOptions(device=device)) if name == "broadcast" else SharedMemoryTransport()


def sync_child(p: dict[str, Any], device: str) -> dict[str, Any]:
    """A full sync of the shape's weights (bf16 on CUDA) from a trainer-side model to an engine in
    another process, over one link (the trainer's ``send_owned``, the engine's ``receive_into``);
    median of 3 (the first opens the link), beside the copy floor for the same bytes."""
    if p["transport"] == "broadcast" and device != "cuda":
        return {"skip": "skipped: needs CUDA"}
    if p["transport"] == "broadcast" and _gpus() < 2:
        # NCCL refuses a communicator with two ranks on one device ("Duplicate GPU detected", NCCL 2.28).
        return {"skip": "skipped: NCCL needs a GPU per rank"}
    if p["transport"] == "object_store":
        return object_store(p, device)
    import multiprocessing as mp

    import torch
    from toolrl.training.weight_sync import send_owned

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = qwen3(p["shape"], device, dtype)
    nbytes = sum(q.numel() * q.element_size() for q in model.parameters())
    sender = transport(p["transport"], device).open_sender("gpu-suite", 0, 1, 60.0)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    child = ctx.Process(target=sync_receiver, args=(p["transport"], p["shape"], device,
                                                    sender.link.model_dump_json(), out), daemon=True)
    child.start()
    sends = []
    for _ in range(3):
        sync(device)
        t0 = time.perf_counter()
        send_owned(model, sender, 0, 1, 512.0)
        sync(device)
        sends.append(time.perf_counter() - t0)
    received = [out.get(timeout=60) for _ in range(3)]
    child.join(30)
    sender.close()
    return sync_figures([max(a, b) for a, b in zip(sends, received)], nbytes, device)


def object_store(p: dict[str, Any], device: str) -> dict[str, Any]:
    """The object_store transport without a trainer group: a Ray actor holding an engine takes each sync
    over one link (``receive_into``) that this process sends on (``send_owned``, host copies)."""
    try:
        import ray
    except ImportError:
        return {"skip": "skipped: ray not installed"}
    import ray.cloudpickle
    import torch
    from toolrl.training.weight_sync import send_owned
    from toolrl.transports.object_store import ObjectStoreTransport

    # The item's process imported this file as __mp_main__ (launcher), a module Ray's workers cannot import:
    # the actor's helpers (qwen3, sync) travel by value, as a script's __main__ does.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = qwen3(p["shape"], device, dtype)
    nbytes = sum(q.numel() * q.element_size() for q in model.parameters())
    ray.init(num_cpus=2, num_gpus=1 if device == "cuda" else 0, include_dashboard=False, log_to_driver=False)
    try:
        @ray.remote(num_gpus=1 if device == "cuda" else 0)
        class Engine:
            def __init__(self, link_json: str) -> None:
                import sys as _sys

                _sys.path.insert(0, str(HERE))
                from toolrl.engines.transformers import TransformersEngine, TransformersEngineConfig
                from toolrl.model_sources import qwen_tokenizer
                from toolrl.transports import Link

                self.engine = TransformersEngine(qwen3(p["shape"], device, dtype).eval(), qwen_tokenizer(),
                                                 TransformersEngineConfig(device=device))
                self.receiver = ObjectStoreTransport().open_receiver(Link.model_validate_json(link_json), 0)

            def receive(self, version: int) -> None:
                from toolrl.transports.weight_rows import receive_into

                receive_into(self.engine, [self.receiver], version)
                sync(device)

        sender = ObjectStoreTransport().open_sender("gpu-suite", 0, 1, 60.0)
        engine = Engine.remote(sender.link.model_dump_json())
        times = []
        for version in range(3):
            sync(device)
            t0 = time.perf_counter()
            received = engine.receive.remote(version)
            send_owned(model, sender, 0, 1, 512.0)
            ray.get(received)
            times.append(time.perf_counter() - t0)
        sender.close()
    finally:
        ray.shutdown()
    return sync_figures(times, nbytes, device)


# ---- MoE with R3, and toolrl train ----------------------------------------------------------------

def moe_child(p: dict[str, Any], device: str) -> dict[str, Any]:
    """benchmarks/routing_replay.py on ``device``: its last lines, as numbers."""
    res = subprocess.run([sys.executable, str(HERE / "routing_replay.py"), "--device", device, *p["args"]],
                         capture_output=True, text=True, check=True)
    found = {}
    for line in res.stdout.splitlines():
        key, _, value = line.rpartition(": ")
        if key in ("lp mismatch with/without R3", "k3 KL with/without R3", "route recording overhead",
                   "route recording overhead (wall time)"):
            found[key] = float(value)
    return found


def train_child(p: dict[str, Any], device: str, out: Path) -> dict[str, Any]:
    """``toolrl train`` for 3 steps (examples/tiny.yaml: the arithmetic environment's calculator tool,
    multi-turn) on ``device``; the shares of wall time read from its metrics.jsonl."""
    run = out / "train-run"
    dtype = "bfloat16" if device == "cuda" else "float32"
    cmd = [sys.executable, "-m", "toolrl", "train", str(ROOT / "examples" / "tiny.yaml"), "trainer.total_steps=3",
           f"trainer.output_dir={run}", "trainer.plot=false", f"model.device={device}", f"model.dtype={dtype}",
           *p["overrides"]]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    (out / "train.log").write_text(res.stdout + res.stderr)
    if res.returncode:
        raise RuntimeError(f"toolrl train exit {res.returncode}: {(res.stderr.strip().splitlines() or [''])[-1]}")
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = sum(r["step_s"] for r in rows)
    share = {k: sum(r.get(k, 0.0) for r in rows) / steps for k in ("rollout_s", "train_s", "weight_sync_s")}
    return {"wall_s": wall, "steps_s": steps, "generated_tokens_per_s": statistics.fmean(r["tokens_per_s"] for r in rows),
            "trained_tokens_per_s": statistics.fmean(r.get("trainer_tokens_per_s", 0.0) for r in rows),
            "share_generation": share["rollout_s"], "share_training": share["train_s"],
            "share_weight_sync": share["weight_sync_s"],
            "tool_latency_s": rows[-1].get("tool_latency_s", {}), "reward": [r.get("reward_mean") for r in rows]}


def child(item: Item, device: str, out: Path, profile: bool) -> dict[str, Any]:
    if item.kind == "decode_check":
        return decode_check_child(item.params, device)
    if item.kind == "attention":
        return attention_child(item.params, device)
    if item.kind in ("trainer", "engine"):
        run = trainer_child if item.kind == "trainer" else engine_child
        return run({**item.params, "name": item.name}, device, out if profile else None)
    if item.kind == "sync":
        return sync_child(item.params, device)
    if item.kind == "moe":
        return moe_child(item.params, device)
    return train_child(item.params, device, out)


# ---- the parent: run, summarise, write -------------------------------------------------------------

def log(out: Path, item: Item, text: str) -> None:
    (out / "logs").mkdir(exist_ok=True)
    (out / "logs" / f"{item.name.replace('/', '_')}.log").write_text(text)


def item_process(name: str, args: argparse.Namespace, stdout: Path, stderr: Path) -> None:
    """An item's process: its output (Python's and the libraries' own, file descriptors 1 and 2) to the two
    files, its result as the last line of stdout."""
    for fd, path in ((1, stdout), (2, stderr)):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    item = next(i for i in plan(args.smoke) if i.name == name)
    print(json.dumps(child(item, args.device, args.out, args.profile), default=float), flush=True)


# What every item imports (5-7 s a process on a loaded 2-core CPU, the Qwen3 modeling code half of it); importing
# them queries no device (torch.cuda is not called: checked on CPU by wrapping its functions during the imports).
PRELOAD = ["__main__", "torch", "transformers", "transformers.models.qwen3.modeling_qwen3"]


def launcher() -> Any:
    """Starts each item's process: a fork of a server process that imported :data:`PRELOAD` once, itself a
    fresh interpreter (not a fork of this one) that never touches the GPU, so each item still starts with no
    CUDA context, in its own process, with its own cap."""
    import multiprocessing as mp

    # Should an import ask torch.cuda.is_available(), NVML answers, not a CUDA context the forks would inherit.
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def run_item(item: Item, args: argparse.Namespace, ctx: Any) -> dict[str, Any]:
    """One item in its own process within its cap; ``status`` ok, skipped or failed (with why)."""
    logs = args.out / "logs"
    logs.mkdir(exist_ok=True)
    stdout, stderr = (logs / f".{item.name.replace('/', '_')}.{x}" for x in ("out", "err"))
    t0 = time.perf_counter()
    proc = ctx.Process(target=item_process, args=(item.name, args, stdout, stderr))
    proc.start()
    proc.join(item.cap_s * args.cap_scale)
    timed_out = proc.exitcode is None
    if timed_out:
        proc.kill()
        proc.join()
    wall = time.perf_counter() - t0
    said_out, said_err = (p.read_text(errors="replace") if p.exists() else "" for p in (stdout, stderr))
    stdout.unlink(missing_ok=True)
    stderr.unlink(missing_ok=True)
    log(args.out, item, said_out + said_err)
    if timed_out:
        last = ((said_out + said_err).strip().splitlines() or ["nothing printed"])[-1][:200]
        return {"status": f"failed: timeout after {item.cap_s * args.cap_scale:.0f} s (last line: {last})",
                "wall_s": wall}
    lines = said_out.strip().splitlines()
    if proc.exitcode or not lines:
        last = (said_err.strip().splitlines() or [f"exit {proc.exitcode}"])[-1]
        why = "OOM" if "OutOfMemory" in said_err or "out of memory" in said_err else f"exit {proc.exitcode}"
        return {"status": f"failed: {why}: {last[:300]}", "wall_s": wall}
    result = json.loads(lines[-1])
    return {"status": result.pop("skip", "ok"), "wall_s": wall, **result}


def summary(item: Item, r: dict[str, Any], peak: float) -> str:
    """The item's figures in one line."""
    if r["status"] != "ok":
        return r["status"]
    if item.kind == "trainer":
        return (f"{r['step_s']:.3f} s/step, {r['tokens_per_s']:,.0f} tok/s, {r['tflops_per_s']:.1f} TFLOP/s, "
                f"MFU {r['tflops_per_s'] / peak:.1%} (of {MEASURED_TFLOPS:.0f}: {r['tflops_per_s'] / MEASURED_TFLOPS:.1%}), "
                f"peak {r['peak_mb']:,.0f} MB, loss {r['loss']:.6f}")
    if item.kind == "engine":
        share = "" if r.get("device_share") is None else f", GPU busy {r['device_share']:.0%} of wall"
        return (f"{r['decode']}: {r['decode_tokens_per_s']:,.0f} tok/s decode, bound {r['bound_tokens_per_s']:,.0f} "
                f"(HBM {r['hbm_gb_per_s']:,.0f} GB/s), ratio {r['ratio']:.2f}{share}, "
                f"{r['graphs_captured']} graphs captured")
    if item.kind == "decode_check":
        return (f"{r['dtype']}: greedy identical {r['greedy_identical']}, sampled identical {r['sampled_identical']}, "
                f"log-prob diff max {r['max_logprob_diff']:.1e} (mean {r['mean_logprob_diff']:.1e})")
    if item.kind == "attention":
        return "largest relative difference, one call vs spans: " + ", ".join(
            f"{k} {v:.1e}" for k, v in r.items() if isinstance(v, float) and k != "wall_s")
    if item.kind == "sync":
        return (f"{r['sync_s'] * 1e3:.1f} ms for {r['bytes'] / 2**20:,.0f} MiB, copy floor {r['copy_floor_s'] * 1e3:.2f} ms, "
                f"{r['ratio']:.1f}× the floor")
    if item.kind == "moe":
        return ", ".join(f"{k}: {v:.2f}" for k, v in r.items() if isinstance(v, float) and k != "wall_s")
    return (f"gen {r['generated_tokens_per_s']:,.0f} tok/s, trained {r['trained_tokens_per_s']:,.0f} tok/s; "
            f"wall share: generation+tools {r['share_generation']:.0%}, training {r['share_training']:.0%}, "
            f"weight sync {r['share_weight_sync']:.0%}")


def environment(device: str) -> dict[str, str]:
    """The versions from the installed distributions' metadata: the parent imports torch only to name a GPU
    (importing torch and transformers for their versions took 4 s of a CPU smoke run, whose items each
    import them in their own process anyway)."""
    from importlib.metadata import version

    if device == "cuda":
        import torch

        name = torch.cuda.get_device_name(0)
    else:
        name = f"CPU ({platform.machine()}, {os.cpu_count()} cores)"
    return {"device": name, "torch": version("torch"), "transformers": version("transformers"),
            "python": platform.python_version()}


FORMULAS = """\
- MFU = FLOPs / (step s · peak). FLOPs = 6·N_body·T_computed + 6·N_head·T_trained + 12·L·d_attn·P:
  N_body = parameters besides the (tied) embedding/LM-head matrix, T_computed = tokens the model ran
  (prefix-shared: the prompt once), N_head = vocab·hidden (the LM head runs only at trained positions,
  T_trained of them), L = layers, d_attn = heads·head_dim, P = causal (query, key) pairs computed
  (Σ over sequences of n(n+1)/2; prefix-shared: the prompt's own plus each response's against the
  prompt and itself). Activation-checkpointing recompute is not counted. tok/s counts prompt +
  response tokens of the unshared batch.
- Decode bound = batch / ((weight bytes + KV bytes read per step) / HBM GB/s); HBM GB/s = 2 × bytes /
  (one device-to-device copy of 1 GiB), KV read at the decode's mean length (prompt + new/2).
- Sync: one full weight sync, the slower of sender and receiver, median of the 2 after the first;
  copy floor: the same bytes in one device-to-device copy_.
"""


def write(args: argparse.Namespace, env: dict[str, str], results: dict[str, dict[str, Any]],
          items: list[Item]) -> None:
    peak = args.peak_tflops
    (args.out / "gpu_suite.json").write_text(json.dumps({"environment": env, "peak_tflops": peak,
                                                         "results": results}, indent=1, default=str))
    rows = [f"| {i.name} | {summary(i, results[i.name], peak)} | {results[i.name]['wall_s']:.0f} |"
            for i in items if i.name in results]
    nominal = " (nominal: a CPU)" if args.device == "cpu" else ""
    md = [f"# GPU suite{' (smoke)' if args.smoke else ''}", "",
          f"{env['device']} · torch {env['torch']} · transformers {env['transformers']} · python {env['python']} · "
          f"peak {peak:g} TFLOP/s{nominal}, also against {MEASURED_TFLOPS:.0f} measured", "",
          "| item | result | wall s |", "|---|---|---|", *rows, "", FORMULAS]
    (args.out / "gpu_suite.md").write_text("\n".join(md))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes (CPU): checks the suite itself")
    parser.add_argument("--only", default="", help="comma-separated item names or prefixes (trainer, sync/...)")
    parser.add_argument("--peak-tflops", type=float, default=None, help="bf16 dense peak (default: H100 SXM's 989)")
    parser.add_argument("--cap-scale", type=float, default=1.0, help="multiplies every item's time cap")
    parser.add_argument("--profile", action="store_true", help="the trainer and engine items also write a "
                        "profile of one more step (profile_ITEM.txt)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(HERE))
    items = plan(args.smoke)
    if args.device == "cpu":  # before the items' server imports torch
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.peak_tflops is None:
        args.peak_tflops = H100_PEAK_TFLOPS if args.device == "cuda" else CPU_PEAK_TFLOPS
    wanted = [w for w in args.only.split(",") if w]
    items = [i for i in items if not wanted or any(i.name == w or i.name.startswith(w.rstrip("/") + "/") for w in wanted)]
    env = environment(args.device)
    print(f"{env} · {len(items)} items", flush=True)
    results: dict[str, dict[str, Any]] = {}
    t0 = time.perf_counter()
    ctx = launcher()
    for item in items:
        results[item.name] = run_item(item, args, ctx)
        print(f"{item.name}: {summary(item, results[item.name], args.peak_tflops)} "
              f"[{results[item.name]['wall_s']:.0f} s]", flush=True)
        write(args, env, results, items)
    print(f"suite: {time.perf_counter() - t0:.0f} s; {args.out / 'gpu_suite.md'}", flush=True)


if __name__ == "__main__":
    main()
