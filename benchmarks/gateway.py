"""What the gateway costs a model call: the same calls (tiny random Qwen3, transformers engine, a fixed
32 tokens a call) made of the engine directly by the rollout loop, and made by an agent program through
the gateway with the official ``openai`` client, at 1, 16 and 256 concurrent sessions.

    OMP_NUM_THREADS=1 python benchmarks/gateway.py

Config: examples/tiny.yaml with its own tasks (no environment, no tools: the model's first answer ends
the episode), ``rollout.max_new_tokens=32`` and no stop reached before it (a random model with a
151,936-token vocabulary seldom samples the end-of-turn token in 32 draws: the mean tokens a call is
printed both ways). Both ways run ``run_rollouts`` on one engine with the same seeds, so they make the
same calls (the share of identical completions is printed). Direct: one trajectory a call, its latency
``Trajectory.generation_s``; gateway: ``rollout.agent`` a program that makes the call with
``endpoint.client(max_retries=0)``, timed around ``chat.completions.create``. Each episode has its own
client and connection, as separate programs would (the endpoint's clients share one TLS context: a
default client would load the CA certificates, 20 ms or more, each), and the programs run on the agents'
own event loop (toolrl.gateway.agent_loop), as ``rollout.agent`` runs them. Rounds of each concurrency alternate between the two ways
(which goes first alternates too) so machine load hits both alike, after a warm-up round of 256 each way.

Then the gateway's own cost, with the scripted engine (no model: the same 32 tokens at once) in place of
the model: per call at concurrency 1 (median latency, gateway − direct) and at 256 (round wall time,
gateway − direct, per call: the event loop's time for the client, HTTP, render, parse and record).

Last line: ``gateway overhead p99 @256: X.XX`` = p99 through the gateway / p99 direct − 1 (goal ≤ 0.10).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from _common import machine, single_thread

single_thread()

from toolrl.agents import Agent, AgentOptions  # noqa: E402
from toolrl.config import load_config  # noqa: E402
from toolrl.data.sources import load_samples  # noqa: E402
from toolrl.model_sources import load_tokenizer, model_path  # noqa: E402
from toolrl.processes.in_process import build_rollouts  # noqa: E402
from toolrl.rollout import RolloutContext, run_rollouts  # noqa: E402

single_thread()

ROOT = Path(__file__).resolve().parents[1]
TOKENS = 32
# (concurrent sessions, calls measured each way)
LEVELS = [(1, 64), (16, 128), (256, 512)]
SCRIPTED_LEVELS = [(1, 64), (256, 512)]
SCRIPT = "The answer is " + " ".join(f"step{i}" for i in range(TOKENS))  # more than 32 tokens


class OneCall(Agent):
    """An agent program: one chat completion with the official client, timed client-side. Each episode
    has a client of its own (its own connection), as ``rollout.agent.callable`` gives it."""

    name = "one-call"

    def __init__(self) -> None:
        super().__init__(AgentOptions())
        self.latencies: list[float] = []
        self.tokens: list[int] = []

    async def run(self, task: Any, endpoint: Any) -> float:
        async with endpoint.client(max_retries=0) as client:
            t0 = time.perf_counter()
            reply = await client.chat.completions.create(model=endpoint.model, messages=task.prompt)
            self.latencies.append(time.perf_counter() - t0)
        self.tokens.append(reply.usage.completion_tokens)
        return 0.0


async def contexts(data: Path, overrides: list[str]) -> tuple[Any, RolloutContext, RolloutContext, OneCall, list]:
    """The run's rollouts (examples/tiny.yaml + ``overrides``), the direct context and the gateway's
    (the same engine and route, the route's agent the timed program)."""
    config = load_config(ROOT / "examples" / "tiny.yaml", [
        "env=null", f"data.train_files=[{data}]", f"rollout.max_new_tokens={TOKENS}",
        "rollout.max_response_tokens=64", "rollout.max_concurrent_trajectories=256", "engine.max_batch_size=256",
        *overrides])
    path = model_path(config)
    samples = load_samples(config)
    rollouts = await build_rollouts(config, path, load_tokenizer(path), samples=samples)
    direct = rollouts.ctx
    agent = OneCall()
    gateway = RolloutContext(direct.engine, direct.renderer_factory, direct.config,
                             {name: replace(route, agent=agent) for name, route in direct.routes.items()})
    return rollouts, direct, gateway, agent, samples


async def measure(direct: RolloutContext, gateway: RolloutContext, agent: OneCall, samples: list,
                  level: int, calls: int) -> dict[str, Any]:
    """``calls`` calls each way, in rounds of ``level`` concurrent episodes, alternating (which way goes
    first alternates too)."""
    lat: dict[str, list[float]] = {"direct": [], "gateway": []}
    wall = {"direct": 0.0, "gateway": 0.0}
    tokens, same = [], 0
    for r in range(calls // level):
        batch = [samples[(r * level + i) % len(samples)] for i in range(level)]
        agent.latencies, agent.tokens = [], []
        got = {}
        ways = [("direct", direct), ("gateway", gateway)]
        for way, ctx in ways if r % 2 == 0 else ways[::-1]:
            t0 = time.perf_counter()
            trajs = await run_rollouts(ctx, batch, 1, seed=r, id_prefix=f"{way}{level}-{r}-")
            wall[way] += time.perf_counter() - t0
            failed = [t.error for t in trajs if t.error]
            if failed:
                raise SystemExit(f"{way}: {len(failed)} failed episodes, e.g. {failed[0]}")
            got[way] = trajs
        lat["direct"] += [t.generation_s for t in got["direct"]]
        lat["gateway"] += agent.latencies
        tokens += [statistics.mean(len(t.response_ids) for t in got["direct"]), statistics.mean(agent.tokens)]
        same += sum(a.response_ids == b.response_ids for a, b in zip(got["direct"], got["gateway"]))
    return {"lat": lat, "wall": wall, "tokens": tokens, "same": same / (calls // level * level)}


def pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] * 1e3 if len(values) > 1 else values[0] * 1e3


def row(label: str, got: dict[str, Any]) -> tuple[str, float]:
    d, g = got["lat"]["direct"], got["lat"]["gateway"]
    ratio = pct(g, 99) / pct(d, 99) - 1
    return (f"| {label} | {len(d)} | {pct(d, 50):.1f} | {pct(d, 99):.1f} | {pct(g, 50):.1f} | {pct(g, 99):.1f} "
            f"| {ratio:+.3f} |"), ratio


async def main_async(tmp: Path) -> None:
    data = tmp / "tasks.jsonl"
    data.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": f"Question {i}: what is {i} plus "
                                                     f"{i + 7}? Think it through, then answer."}]}) + "\n"
                            for i in range(256)))
    print(machine())
    rollouts, direct, gateway, agent, samples = await contexts(data, [])
    rows, ratio256 = [], 0.0
    try:
        # Warm both paths at the largest batch: the engine's buffers, the server's connections.
        await measure(direct, gateway, agent, samples, 256, 256)
        for level, calls in LEVELS:
            got = await measure(direct, gateway, agent, samples, level, calls)
            line, ratio = row(f"{level}", got)
            rows.append(line)
            ratio256 = ratio if level == 256 else ratio256
            print(f"{'transformers':<12} {level:>3}: {calls} calls, "
                  f"mean tokens a call {statistics.mean(got['tokens'][0::2]):.2f} direct, "
                  f"{statistics.mean(got['tokens'][1::2]):.2f} gateway, identical completions {got['same']:.0%}; "
                  f"wall {got['wall']['direct']:.2f} s direct, {got['wall']['gateway']:.2f} s gateway", flush=True)
    finally:
        await gateway.close()
        await rollouts.close()
    rollouts, direct, gateway, agent, samples = await contexts(data, [
        "engine.name=scripted", f"engine.options.script=[{SCRIPT}]"])
    cost = []
    try:
        await measure(direct, gateway, agent, samples, 256, 256)
        for level, calls in SCRIPTED_LEVELS:
            got = await measure(direct, gateway, agent, samples, level, calls)
            d, g, wall = got["lat"]["direct"], got["lat"]["gateway"], got["wall"]
            per_call = (pct(g, 50) - pct(d, 50)) if level == 1 else (wall["gateway"] - wall["direct"]) / calls * 1e3
            cost.append(f"scripted engine @{level}: {calls} calls of "
                        f"{statistics.mean(got['tokens']):.0f} tokens, latency p50 {pct(d, 50):.2f} ms direct, "
                        f"{pct(g, 50):.2f} ms gateway; wall per call {wall['direct'] / calls * 1e3:.2f} ms direct, "
                        f"{wall['gateway'] / calls * 1e3:.2f} ms gateway: the gateway's cost "
                        f"{per_call:.2f} ms per call ({'latency' if level == 1 else 'wall'})")
    finally:
        await gateway.close()
        await rollouts.close()
    print("\n| concurrency | calls | direct p50 ms | direct p99 ms | gateway p50 ms | gateway p99 ms "
          "| p99 ratio − 1 |\n|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print("\n" + "\n".join(cost))
    print(f"gateway overhead p99 @256: {ratio256:.2f}")


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="toolrl-bench-gateway-"))
    try:
        asyncio.run(main_async(tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
