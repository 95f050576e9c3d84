"""Context policies on the ledger environment (plugins/ledger): which complete at ``model.max_context``
4096, what their segments cost the trainer, and the prefill the engine's kept KV saves.

1. **Completion.** N ledgers of ``--pages`` (32) ``read_page`` calls, each result about 1k tokens, the
   answer on page 1, with each policy (``none``, ``drop_tool_outputs``, ``window``, ``summarise``,
   ``fold``: page 1 on the main line, the other pages in branches of two) at ``model.max_context`` 4096. The turns are made by ``toolrl_ledger.agent.LedgerAgent`` (a rule-following
   agent that reads its context: the tiny model cannot make the calls); the config, routes, agent loop,
   Qwen2.5 chat template, tool and policies are real. ``completed``: the trajectory answered;
   ``correct``: with the audit key (what it still knew).
2. **Trainer.** One GRPO update (``train_step``, micro-batches of one sequence) on the tiny Qwen3 over
   one trajectory's segments, in a fresh process each (``--child``): ``none`` (one segment, cut at the
   limit) against ``summarise`` and ``fold`` (every segment of the whole task): tokens (prompt +
   response) and trained tokens (mask 1) per second, and the peak trainer memory (``trainer_peak_mb``;
   RSS peak beside it).
3. **Prefill.** Every generation call of a trajectory replayed, in order, through the transformers
   engine with the tiny Qwen3 (its prompt, one new token, the session the loop used: the trajectory's,
   a branch's own under ``fold``): the share of prompt tokens the engine's kept session KV saved
   (``Generation.prefill_tokens_saved``, the engine's counter), per policy (an edit keeps the KV of the
   prefix it keeps; a branch keeps the main line's).

    OMP_NUM_THREADS=1 python benchmarks/context_policies.py [--quick] [--n 10] [--pages 32]

Needs ``toolrl[train]``, the calculator plugin and the ledger plugin. ``--quick``: N = 4, 24 pages, the
prefill replay on one trajectory per policy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import machine, run_child, single_thread, table

single_thread()

POLICIES = ("none", "drop_tool_outputs", "window", "summarise", "fold")
TRAINED = ("none", "summarise", "fold")  # the trainer rows: no policy against two that complete the task
MAX_CONTEXT = 4096


def config(policy: str, pages: int, n: int) -> Any:
    from toolrl.config import Config

    return Config.model_validate({
        "env": "ledger", "env_options": {"pages": pages, "train_size": n},
        "model": {"source": "tiny-qwen3", "tokenizer": "qwen2_5", "max_context": MAX_CONTEXT},
        "rollout": {"context": {"name": policy}, "tool_response_max_tokens": 1500, "max_response_tokens": 200_000,
                    "max_new_tokens": 256}})


async def rollouts(policy: str, pages: int, n: int, tokenizer: Any) -> list[list[Any]]:
    """Each ledger's trajectory under ``policy``: its segments, in order."""
    from toolrl.data.sources import load_samples
    from toolrl.renderers.families import renderer_factory
    from toolrl.rollout import RolloutContext, run_trajectory_pieces
    from toolrl.rollout.routes import build_routes
    from toolrl_ledger.agent import LedgerAgent

    cfg = config(policy, pages, n)
    samples = load_samples(cfg)
    routes, owned = await build_routes(cfg, samples)
    try:
        ctx = RolloutContext(LedgerAgent(tokenizer), renderer_factory(tokenizer), cfg.rollout, routes)
        return list(await asyncio.gather(*(run_trajectory_pieces(ctx, s, i, f"{policy}-{i}", seed=i)
                                           for i, s in enumerate(samples))))
    finally:
        for part in owned:
            await part.close()


def generation_prompts(segments: list[Any]) -> dict[str, list[list[int]]]:
    """The prompt of every generation call of a trajectory, in order, by the engine session the loop
    used (a fold branch has its own; every other segment the trajectory's): each run of model tokens
    (mask 1) was generated from the segment's tokens before it."""
    prompts: dict[str, list[list[int]]] = {}
    for seg in segments:
        session = f"branch{seg.piece}" if seg.edit is not None and seg.edit.action == "fold" else "main"
        for i, m in enumerate(seg.response_mask):
            if m and (i == 0 or not seg.response_mask[i - 1]):
                prompts.setdefault(session, []).append(seg.prompt_ids + seg.response_ids[:i])
    return prompts


async def prefill_saved(prompts: list[list[int]], engine: Any, session: str) -> tuple[int, int]:
    """(prompt tokens, tokens not prefilled) over ``prompts`` sent in order as one session."""
    from toolrl.engines import SamplingParams

    total = saved = 0
    for prompt in prompts:
        gen = (await engine.generate(prompt, SamplingParams(temperature=0.0, max_new_tokens=1), 1,
                                     session_id=session))[0]
        total, saved = total + len(prompt), saved + gen.prefill_tokens_saved
    engine.end_session(session)
    return total, saved


def child(path: str) -> None:
    """One GRPO update over the trajectory segments in ``path`` (JSONL), twice; the warm one reported."""
    import torch
    from toolrl.config import AlgorithmConfig, OptimConfig
    from toolrl.model_sources import load_model, tiny_qwen3
    from toolrl.training.step import StepOptions, train_step
    from toolrl.trajectory import Trajectory

    single_thread()
    segments = [Trajectory.model_validate_json(line) for line in Path(path).read_text().splitlines()]
    model = load_model(tiny_qwen3(tokenizer_variant="qwen2_5")).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-12)
    options = StepOptions(AlgorithmConfig(), OptimConfig(micro_batch_size=1), pad_id=0, temperature=1.0,
                          max_response_tokens=200_000)
    times, metrics = [], {}
    for _ in range(2):
        t0 = time.perf_counter()
        metrics = train_step(model, optimizer, segments, options)
        times.append(time.perf_counter() - t0)
    print(json.dumps({"step_s": times[-1], "trained": sum(sum(s.response_mask) for s in segments),
                      "tokens": sum(len(s.prompt_ids) + len(s.response_ids) for s in segments),
                      "trainer_peak_mb": metrics.get("trainer_peak_mb", float("nan")),
                      "rss_peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def trainer_row(policy: str, segments: list[Any], workdir: Path) -> list[Any]:
    path = workdir / f"{policy}.jsonl"
    path.write_text("".join(s.model_dump_json() + "\n" for s in segments))
    r = run_child(__file__, ["--child", str(path)], f"train {policy}")
    return [policy, len(segments), r["tokens"], r["trained"], r["step_s"], r["tokens"] / r["step_s"],
            r["trained"] / r["step_s"], r["trainer_peak_mb"], r["rss_peak_mb"]]


def completion(results: dict[str, list[list[Any]]], n: int) -> None:
    rows = []
    for policy, trajs in results.items():
        last = [t[-1] for t in trajs]
        rows.append([policy, sum(t.termination == "answered" for t in last), sum(t.reward == 1.0 for t in last),
                     sum(len(t) for t in trajs) / n, max(len(s.prompt_ids) + len(s.response_ids) for t in trajs for s in t),
                     sum(sum(s.response_mask) for t in trajs for s in t) / n, ",".join(sorted({t.termination for t in last}))])
    print(table(["policy", "completed", "correct", "segments/traj", "longest segment", "trained tok/traj",
                 "endings"], rows))
    done = {r[0]: r[1] for r in rows}
    print(f"completed at max_context {MAX_CONTEXT}: " + ", ".join(f"{p} {done[p]}/{n}" for p in POLICIES))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--n", type=int, default=10)
    parser.add_argument("--pages", type=int, default=32)
    parser.add_argument("--child")
    args = parser.parse_args()
    if args.child:
        return child(args.child)
    n, pages = (4, 24) if args.quick else (args.n, args.pages)
    from toolrl.engines.transformers import TransformersEngine, TransformersEngineConfig
    from toolrl.model_sources import load_model, qwen_tokenizer, tiny_qwen3

    print(machine())
    print(f"ledger: {n} trajectories of {pages} read_page calls, model.max_context {MAX_CONTEXT}, scripted agent")
    tokenizer = qwen_tokenizer("qwen2_5")
    t0 = time.perf_counter()
    results = {p: asyncio.run(rollouts(p, pages, n, tokenizer)) for p in POLICIES}
    print(f"rollouts: {time.perf_counter() - t0:.1f} s")
    completion(results, n)

    with tempfile.TemporaryDirectory() as tmp:
        rows = [trainer_row(p, results[p][0], Path(tmp)) for p in TRAINED]
    print("\none GRPO update over one trajectory's segments (tiny Qwen3, micro-batches of 1 sequence):")
    print(table(["policy", "segments", "tokens", "trained", "step s", "tok/s", "trained tok/s", "trainer_peak_mb",
                 "RSS peak MB"], rows))
    for row in rows[1:]:
        print(f"{row[0]}/none: tok/s {row[5] / rows[0][5]:.2f}, trained tok/s {row[6] / rows[0][6]:.2f}, "
              f"trainer peak {row[7] / rows[0][7]:.2f}, trained tokens {row[3] / rows[0][3]:.2f}")

    engine = TransformersEngine(load_model(tiny_qwen3(tokenizer_variant="qwen2_5")), tokenizer,
                                TransformersEngineConfig())
    replayed = 1 if args.quick else 2
    rows = []
    for policy in POLICIES:
        total = saved = 0
        for k, segments in enumerate(results[policy][:replayed]):
            for session, prompts in generation_prompts(segments).items():
                t, s = asyncio.run(prefill_saved(prompts, engine, f"{policy}-{k}-{session}"))
                total, saved = total + t, saved + s
        rows.append([policy, total, saved, saved / total])
    print(f"\nprefill replayed through the transformers engine ({replayed} trajectory per policy):")
    print(table(["policy", "prompt tokens", "not prefilled", "share saved"], rows))


if __name__ == "__main__":
    sys.exit(main())
