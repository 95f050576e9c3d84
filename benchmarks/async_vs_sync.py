"""Asynchronous vs synchronous training: trained samples per second, end to end.

The real training loop (``toolrl.processes.controller.train_async``, in one process: the transformers engine and
the trainer share the tiny random Qwen3) runs the same model, data, seeds and workload with
``trainer.max_staleness`` 0 (synchronous), 1 and 2 (``stream``), and 1 with ``trainer.async_schedule:
one_step_off`` (each step's batch generated whole while the step before trains: reproducible), side by
side in one invocation. Only the tool and the tool-call decision are stand-ins:

- ``LognormalSearch``: a search tool that sleeps a heavy-tailed latency, ``median · lognormal(0,
  sigma)``, drawn from (seed, trajectory, call) so every mode meets the same latencies for the same
  trajectory, and answers a few words.
- ``StopStringCalls``: the parser. A random model writes no ``<tool_call>`` markup, so generation
  stops at any of a few rare characters (``x``, ``z``, ``q``; about 1 token in 28 of the Qwen
  vocabulary contains one) and a turn that stopped there is a call of the tool (no other turn
  contains one). Response lengths
  therefore vary (geometric turns, most under ``max_new_tokens``); a turn that reaches
  ``max_new_tokens`` ends its trajectory, so turns per trajectory vary too.
- ``even_tokens``: the reward is the share of generated token ids that are even (a signal with
  variance, so every step has a real gradient).

Throughput is the trained samples (trajectories) per second between the metrics line of the first
step and that of the last: the model build and the first step (jinja compile, allocator warm-up)
are left out, the same for every mode. The work per mode is the same in distribution, not token for
token (asynchronous weights sample other tokens): the table shows tokens and tool calls per
trajectory so that can be checked.

    python benchmarks/async_vs_sync.py [--quick] [--steps 12] [--seed 0] [--tool-median-ms 400] [--no-one-step-off]

Also printed: the ratio that overlapping the synchronous run's rollout and training phases alone
would give (sum of both over sum of the longer), for reference. Last line: ``async/sync
throughput: X.XX`` (max_staleness 1 against 0).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _common import machine, single_thread, table

single_thread()

from toolrl.config import load_config  # noqa: E402
from toolrl.parsers import ToolParser  # noqa: E402
from toolrl.plugins import get_plugins  # noqa: E402
from toolrl.plugins.registry import Part  # noqa: E402
from toolrl.schemas import ParseResult, ToolCall  # noqa: E402
from toolrl.tools import Tool  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
STOPS = ["x", "z", "q"]


class LognormalSearch(Tool):
    """Sleeps ``median_s · lognormal(0, sigma)`` per call, fixed by (seed, trajectory, call number)."""

    schema = {"type": "function", "function": {
        "name": "search", "description": "Search the web.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}
    median_s = 0.4
    sigma = 1.0
    seed = 0

    async def execute(self, instance_id: str, arguments: dict[str, Any], **kw: Any) -> tuple[str, float, dict]:
        state = self.state(instance_id)
        call = state["calls"] = state.get("calls", 0) + 1
        rng = random.Random(f"{self.seed}:{instance_id}:{call}")
        await asyncio.sleep(self.median_s * rng.lognormvariate(0, self.sigma))
        return f"Result {call}: " + " ".join(rng.choice(("alpha", "beta", "gamma", "delta")) for _ in range(8)), 0.0, {}


class StopStringCalls(ToolParser):
    """A turn that stopped at one of ``STOPS`` calls the search tool (a random model writes no markup)."""

    name = "stop_string_calls"

    @property
    def stop_strings(self) -> list[str]:
        return STOPS

    def parse(self, text: str) -> ParseResult:
        if any(s in text for s in STOPS):  # generation stops at the first one (or ends at max_new_tokens)
            return ParseResult(content=text, calls=[ToolCall(name="search", arguments={"query": text[-40:]})])
        return ParseResult(content=text)


class EvenTokens:
    name = "even_tokens"

    def __call__(self, response: str, ground_truth: Any, **info: Any) -> float:
        ids = info["response_ids"]
        return sum(t % 2 == 0 for t in ids) / max(len(ids), 1)


def register() -> None:
    registry = get_plugins().registry
    for kind, name, obj in (("tools", "lognormal_search", LognormalSearch),
                            ("tool_parsers", StopStringCalls.name, StopStringCalls),
                            ("reward_functions", EvenTokens.name, EvenTokens)):
        if not registry.has(kind, name):
            registry.add(Part(kind, name, "benchmark", obj))


class LineClock(threading.Thread):
    """Notes when each line of ``metrics.jsonl`` appears (polls every 5 ms): when each step ended."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path, self.times, self.stop = path, [], threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                lines = self.path.read_text().count("\n")
            except OSError:
                lines = 0
            now = time.perf_counter()
            self.times += [now] * (lines - len(self.times))
            time.sleep(0.005)


def run_mode(staleness: int, args: argparse.Namespace, out: Path, one_step_off: bool = False) -> dict[str, Any]:
    from toolrl.processes.controller import train_async

    overrides = [
        f"trainer.output_dir={out}", f"trainer.total_steps={args.steps}", f"trainer.seed={args.seed}",
        f"rollout.seed={args.seed}", "trainer.plot=false", "trainer.progress=false", "trainer.save_every=1000",
        f"data.batch_size={args.batch_size}", f"rollout.n={args.n}", f"rollout.max_turns={args.max_turns}",
        f"rollout.max_new_tokens={args.max_new_tokens}", "rollout.max_response_tokens=1024",
        f"rollout.parser={StopStringCalls.name}", "tools.entries=[{class_name: lognormal_search}]",
        "reward.functions=[{name: even_tokens}]", "optim.lr=1.0e-4", "optim.micro_batch_size=8",
        f"algorithm.tis_cap={args.tis_cap}",
    ]
    if staleness:  # k = 0 runs with the key unset: today's synchronous loop
        overrides.append(f"trainer.max_staleness={staleness}")
    if one_step_off:
        overrides.append("trainer.async_schedule=one_step_off")
    config = load_config(ROOT / "examples" / "tiny.yaml", overrides)
    clock = LineClock(out / "metrics.jsonl")
    clock.start()
    t0 = time.perf_counter()
    asyncio.run(train_async(config))
    total = time.perf_counter() - t0
    time.sleep(0.02)
    clock.stop.set()
    clock.join()
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    traces = [json.loads(x) for p in sorted((out / "rollouts").glob("step_*.jsonl"))
              for x in p.read_text().splitlines() if x.strip()]
    if len(clock.times) != len(rows) or len(rows) != args.steps:
        raise SystemExit(f"max_staleness={staleness}: {len(rows)} metrics lines, saw {len(clock.times)} appear")
    per_step = args.batch_size * args.n
    span = clock.times[-1] - clock.times[0]
    staleness_seen = []
    for row, path in zip(rows, sorted((out / "rollouts").glob("step_*.jsonl")), strict=True):
        for x in path.read_text().splitlines():
            version = json.loads(x).get("policy_version")
            if version is not None:
                first = version[0] if isinstance(version, list) else version
                staleness_seen.append(row["step"] - 1 - first)
    return {
        "k": staleness, "mode": f"k={staleness}" + (" one_step_off" if one_step_off else ""), "samples_per_s": per_step * (len(rows) - 1) / span, "span_s": span, "total_s": total,
        "reward_first": sum(r["reward_mean"] for r in rows[:2]) / 2,
        "reward_last": sum(r["reward_mean"] for r in rows[-2:]) / 2,
        "tokens_per_traj": sum(sum(t["response_mask"]) for t in traces) / len(traces),
        "calls_per_traj": sum(len(t["tool_results"]) for t in traces) / len(traces),
        "tool_s_per_traj": sum(t.get("tool_s", 0.0) for t in traces) / len(traces),
        "mean_staleness": sum(staleness_seen) / len(staleness_seen) if staleness_seen else float("nan"),
        "max_staleness_seen": max(staleness_seen, default=-1),
        "train_s": sum(r.get("train_s", 0.0) for r in rows[1:]) / (len(rows) - 1),
        # Synchronous steps are rollout then training: with both overlapped perfectly and neither
        # slowed by the other, a step would take the longer of the two.
        "overlap_bound": sum(r["rollout_s"] + r["train_s"] for r in rows[1:])
        / sum(max(r["rollout_s"], r["train_s"]) for r in rows[1:]),
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer steps: a few minutes")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--staleness", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--batch-size", type=int, default=2, help="prompts per step")
    ap.add_argument("--n", type=int, default=4, help="trajectories per prompt")
    ap.add_argument("--max-turns", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--tool-median-ms", type=float, default=400.0)
    ap.add_argument("--tool-sigma", type=float, default=1.0)
    ap.add_argument("--tis-cap", type=float, default=2.0)
    ap.add_argument("--one-step-off", action=argparse.BooleanOptionalAction, default=True,
                    help="also k=1 with trainer.async_schedule=one_step_off")
    args = ap.parse_args(argv)
    if args.quick:
        args.steps = min(args.steps, 6)
    if 0 not in args.staleness or 1 not in args.staleness:
        raise SystemExit("--staleness must include 0 and 1 (the reported ratio is k=1 against k=0)")
    LognormalSearch.median_s, LognormalSearch.sigma, LognormalSearch.seed = \
        args.tool_median_ms / 1000, args.tool_sigma, args.seed
    register()

    print(f"machine: {machine()}")
    print(f"workload: tiny-qwen3 (random, in-process transformers engine), {args.steps} steps × {args.batch_size} "
          f"prompts × {args.n}; up to {args.max_turns} turns of ≤ {args.max_new_tokens} tokens, a turn stopping at "
          f"{'/'.join(STOPS)} calls a tool of latency {args.tool_median_ms:g} ms·lognormal(0, {args.tool_sigma:g}); "
          f"tis_cap {args.tis_cap:g}; seed {args.seed}\n")
    results = []
    with tempfile.TemporaryDirectory(prefix="async_vs_sync-") as tmp:
        for k, off in [(k, False) for k in args.staleness] + [(1, True)] * args.one_step_off:
            results.append(run_mode(k, args, Path(tmp) / f"k{k}{'-off' * off}", one_step_off=off))
            r = results[-1]
            print(f"{r['mode']}: {r['samples_per_s']:.2f} samples/s", flush=True)
    base = next(r for r in results if r["mode"] == "k=0")
    print()
    print(table(["mode", "samples/s", "vs k=0", "span s", "train s/step", "tokens/traj", "calls/traj",
                 "tool s/traj", "mean stale", "max stale", "reward first", "reward last"],
                [[r["mode"], r["samples_per_s"], r["samples_per_s"] / base["samples_per_s"], r["span_s"], r["train_s"],
                  r["tokens_per_traj"], r["calls_per_traj"], r["tool_s_per_traj"], r["mean_staleness"],
                  r["max_staleness_seen"], r["reward_first"], r["reward_last"]] for r in results]))
    one = next(r for r in results if r["mode"] == "k=1")
    print(f"\nk=0's rollout and training phases overlapped perfectly, neither slowed: {base['overlap_bound']:.2f} "
          "(streaming also hides slow trajectories behind others, so k >= 1 can pass it)")
    for r in results:
        if r["mode"] == "k=1 one_step_off":
            print(f"\none_step_off/sync throughput: {r['samples_per_s'] / base['samples_per_s']:.2f}")
    print(f"\nasync/sync throughput: {one['samples_per_s'] / base['samples_per_s']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
