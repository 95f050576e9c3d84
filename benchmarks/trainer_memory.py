"""Trainer memory and speed: ``toolrl.training.step.train_step`` (packed rows, chunked LM-head logprobs)
against the full-logits padded computation that it replaced, kept here as the anchor.

One GRPO update (forward, backward, clipping, a stateless SGD step) on the tiny Qwen3
(``toolrl.model_sources.tiny_qwen3``: hidden 64, 152k vocabulary, fp32), 64-token prompts, every response
token trained, two cases:

- pair: 2 sequences × 2048 response tokens, one micro-batch of 2;
- ragged: 8 response lengths evenly spread over [128, --ragged-max (2048)], micro-batches of
  ``--ragged-micro-batch`` sequences in a fixed shuffled order (the anchor pads each micro-batch to
  its longest sequence; toolrl packs it).

The anchor is the previous ``train_step``: right-padded rows with an attention mask, fp32 logits of
every response position of a micro-batch (``lm_head(h).float()``, log-sum-exp, gather) kept for
backward. Each variant runs in a fresh subprocess (``--child``), so the peak RSS
(``ru_maxrss``) is that variant's alone; ``step MB`` is that peak minus the RSS just before the
step (model and interpreter excluded). Each child runs the step twice and reports the second
(warm) time. ``tok/s`` counts real tokens (prompt + response, no padding) per second.

    OMP_NUM_THREADS=1 python benchmarks/trainer_memory.py [--quick] [--ragged-max 2048] \\
        [--ragged-micro-batch 2]

The anchor needs about 2.4 MB per padded response position of a micro-batch: about 10 GB at
2 × 2048, 20 GB for a micro-batch of 2 × 4096 — hence the defaults, which fit a 24 GiB machine
(``--ragged-max 4096 --ragged-micro-batch 1`` also does, with an unpadded anchor).
``--quick`` runs 2 × 512 and lengths up to 1024.
The last line reads ``peak memory new/full: X.XX`` (step memory of the pair case).
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import time
from types import SimpleNamespace
from typing import Any

from _common import machine, run_child, single_thread, table

single_thread()

PROMPT = 64


def trajectories(lengths: list[int]) -> list[Any]:
    from toolrl.trajectory import Trajectory

    rng = random.Random(0)
    out = []
    for i, n in enumerate(lengths):
        ids = [rng.randrange(100, 150_000) for _ in range(PROMPT + n)]
        out.append(Trajectory(trajectory_id=str(i), sample_index=i // 2, group=i // 2, prompt_ids=ids[:PROMPT],
                              response_ids=ids[PROMPT:], response_mask=[1] * n, logprobs=[0.0] * n,
                              reward=float(i % 2)))
    return out


def anchor_step(model: Any, optimizer: Any, trajs: list[Any], algo: Any, micro: int, max_response: int) -> float:
    """The padded full-logits GRPO update (one epoch, one mini-batch); returns the padding fraction."""
    import torch
    from toolrl.training.step import group_advantages, policy_loss

    adv = group_advantages([t.reward for t in trajs], [t.group for t in trajs])
    norm = {"tokens": float(sum(len(t.response_ids) for t in trajs)), "seqs": float(len(trajs)),
            "max_len": float(max_response)}
    base = getattr(model, model.base_model_prefix)
    optimizer.zero_grad(set_to_none=True)
    padded = real = 0
    for a in range(0, len(trajs), micro):
        chunk, chunk_adv = trajs[a:a + micro], adv[a:a + micro]
        width = max(len(t.prompt_ids) + len(t.response_ids) for t in chunk)
        rwidth = max(len(t.response_ids) for t in chunk)
        ids = torch.zeros((len(chunk), width), dtype=torch.long)
        attention = torch.zeros_like(ids)
        targets = torch.zeros((len(chunk), rwidth), dtype=torch.long)
        mask = torch.zeros((len(chunk), rwidth))
        for i, t in enumerate(chunk):
            seq = t.prompt_ids + t.response_ids
            ids[i, : len(seq)] = torch.tensor(seq)
            attention[i, : len(seq)] = 1
            targets[i, : len(t.response_ids)] = torch.tensor(t.response_ids)
            mask[i, : len(t.response_ids)] = 1
        padded += ids.numel()
        real += int(attention.sum())
        hidden = base(input_ids=ids, attention_mask=attention, use_cache=False).last_hidden_state
        pos = torch.tensor([len(t.prompt_ids) for t in chunk])[:, None] - 1 + torch.arange(rwidth)[None, :]
        pos = pos.clamp(max=width - 1)
        h = hidden.gather(1, pos[..., None].expand(-1, -1, hidden.shape[-1]))
        logits = model.get_output_embeddings()(h).float()
        lp = logits.gather(-1, targets[..., None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)
        batch = SimpleNamespace(response_mask=mask, advantages=torch.tensor(chunk_adv),
                                engine_logprobs=torch.zeros_like(mask))
        loss, _ = policy_loss(lp, lp.detach(), batch, algo, norm)
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return (padded - real) / padded


def child(variant: str, lengths: list[int], micro: int, chunk: int) -> None:
    import torch
    from toolrl.config import AlgorithmConfig, OptimConfig
    from toolrl.model_sources import load_model, tiny_qwen3
    from toolrl.training.peakmem import rss_bytes
    from toolrl.training.step import StepOptions, train_step

    single_thread()
    model = load_model(tiny_qwen3()).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-12)
    trajs = trajectories(lengths)
    algo = AlgorithmConfig()
    optim = OptimConfig(micro_batch_size=micro, logprob_chunk_size=chunk)
    before = (rss_bytes() or 0) / 2**20
    times, extra = [], {}
    for _ in range(2):
        t0 = time.perf_counter()
        if variant == "full":
            extra["padding"] = anchor_step(model, optimizer, trajs, algo, micro, max(lengths))
        else:
            m = train_step(model, optimizer, trajs,
                          StepOptions(algo, optim, pad_id=0, temperature=1.0, max_response_tokens=max(lengths)))
            extra = {"padding": m["padding_fraction"], "metric_peak_mb": m.get("trainer_peak_mb", float("nan"))}
        times.append(time.perf_counter() - t0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    tokens = sum(len(t.prompt_ids) + len(t.response_ids) for t in trajs)
    print(json.dumps({"peak_mb": peak, "before_mb": before, "step_s": times[-1], "first_s": times[0],
                      "tokens": tokens, **extra}))


def run_variant(variant: str, lengths: list[int], micro: int, chunk: int) -> dict[str, Any]:
    return run_child(__file__, ["--child", variant, "--lengths", ",".join(map(str, lengths)), "--micro", str(micro),
                                "--chunk", str(chunk)], f"{variant} {lengths}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 × 512 and lengths up to 1024")
    parser.add_argument("--ragged-max", type=int, default=None, help="longest ragged response (default 2048)")
    parser.add_argument("--ragged-micro-batch", type=int, default=2)
    parser.add_argument("--chunk", type=int, default=None, help="optim.logprob_chunk_size (default: config's)")
    parser.add_argument("--child", choices=["new", "full"])
    parser.add_argument("--lengths")
    parser.add_argument("--micro", type=int)
    args = parser.parse_args()
    from toolrl.config import DEFAULT_LOGPROB_CHUNK

    chunk = args.chunk or DEFAULT_LOGPROB_CHUNK
    if args.child:
        child(args.child, [int(x) for x in args.lengths.split(",")], args.micro, chunk)
        return
    pair = 512 if args.quick else 2048
    top = args.ragged_max or (1024 if args.quick else 2048)
    ragged = [round(128 + i * (top - 128) / 7) for i in range(8)]
    random.Random(1).shuffle(ragged)
    cases = [(f"pair 2 × {pair}", [pair, pair], 2), (f"ragged 8 in [128, {top}]", ragged, args.ragged_micro_batch)]
    print(machine())
    print(f"tiny Qwen3 (hidden 64, vocab 151936), fp32, prompt {PROMPT} tokens, logprob chunk {chunk}, "
          f"ragged response lengths in order {ragged}")
    rows, ratios = [], {}
    for name, lengths, micro in cases:
        got = {v: run_variant(v, lengths, micro, chunk) for v in ("new", "full")}
        for v in ("full", "new"):
            r = got[v]
            rows.append([name, "toolrl" if v == "new" else "anchor (padded, full logits)", micro, r["padding"],
                         r["peak_mb"], r["peak_mb"] - r["before_mb"], r["step_s"], r["tokens"] / r["step_s"],
                         r.get("metric_peak_mb", "")])
        new, full = got["new"], got["full"]
        ratios[name] = ((new["peak_mb"] - new["before_mb"]) / (full["peak_mb"] - full["before_mb"]),
                        new["peak_mb"] / full["peak_mb"],
                        (new["tokens"] / new["step_s"]) / (full["tokens"] / full["step_s"]))
    print(table(["case", "variant", "micro", "padding", "peak RSS MB", "step MB", "step s", "tok/s",
                 "trainer_peak_mb"], rows))
    for name, (step, total, speed) in ratios.items():
        print(f"{name}: step memory new/full {step:.3f}, process peak new/full {total:.3f}, "
              f"tokens/s new/full {speed:.2f}×")
    print(f"peak memory new/full: {ratios[cases[0][0]][0]:.2f}")


if __name__ == "__main__":
    main()
