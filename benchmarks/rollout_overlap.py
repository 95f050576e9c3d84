"""Rollout overlap: does a trajectory waiting on a slow tool hold up the others?

64 trajectories (16 prompts × 4) × 3 turns go through the real ``toolrl.rollout.run_rollouts``
with the real Qwen3 tokenizer, chat template (``ChatRenderer``), hermes parser and ``ToolSet``.
Only the model and the tool are simulated:

- ``SimulatedEngine``: a continuous-batching engine whose decode step costs a fixed time whatever
  the batch size (a GPU decoding a small batch). Every step, each running request gets one token;
  requests that arrive during a step join at the next one. Turns 1–2 emit a reasoning block of
  random (lognormal) length and a hermes tool call; turn 3 emits an answer.
- ``HeavyTailTool``: sleeps a lognormal latency per call (seeded by trajectory and call number).

Reported, side by side:

- the critical-path bound: the longest trajectory's own generation time (its tokens × step time)
  plus its own tool latencies, i.e. the wall time if it ran alone on the engine;
- toolrl's continuous loop (``run_rollouts``);
- a batch-synchronous loop over the same engine, tool, renderer and parser: each turn, generate
  for every live trajectory, wait for all, run all their calls, wait for all, next turn.

Both loops must produce the same tokens per trajectory (checked), so they do the same work.

    python benchmarks/rollout_overlap.py [--seeds 0 1 2] [--step-ms 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from _common import machine, single_thread, table

single_thread()

from toolrl.config import RewardConfig, RolloutConfig  # noqa: E402
from toolrl.engines import Generation, ModelSource, RolloutEngine, SamplingParams  # noqa: E402
from toolrl.model_sources import qwen_tokenizer  # noqa: E402
from toolrl.parsers.hermes import HermesParser  # noqa: E402
from toolrl.renderers.chat import ChatRenderer  # noqa: E402
from toolrl.rollout import RolloutContext, Route, run_rollouts  # noqa: E402
from toolrl.schemas import Sample  # noqa: E402
from toolrl.tools import Tool, ToolSet  # noqa: E402
from toolrl.trajectory import Trajectory, root_id  # noqa: E402

PROMPTS, N, TURNS = 16, 4, 3
# Words that are one Qwen token each (with their leading space): the reasoning filler's length in
# tokens follows the number of words drawn.
FILLER = (" the", " answer", " we", " need", " to", " check", " first", " then", " so", " it")


@dataclass
class Workload:
    seed: int
    step_s: float = 0.003  # one decode step
    think_median: float = 50.0  # reasoning words per turn: 20 + median · lognormal(0, think_sigma)
    think_sigma: float = 1.0
    tool_median_s: float = 0.15  # tool latency: median · lognormal(0, tool_sigma)
    tool_sigma: float = 1.0

    def rng(self, *key: object) -> random.Random:
        return random.Random(":".join(map(str, (self.seed, *key))))  # str seeds hash deterministically

    def text(self, session: str, turn: int) -> str:
        words = 20 + int(self.think_median * self.rng("think", session, turn).lognormvariate(0, self.think_sigma))
        think = "<think>\n" + "".join(FILLER[i % len(FILLER)] for i in range(words)) + "\n</think>\n\n"
        if turn < TURNS - 1:
            call = {"name": "search", "arguments": {"query": f"{session} turn {turn}"}}
            return think + "<tool_call>\n" + json.dumps(call) + "\n</tool_call>"
        return think + "The answer is 42."

    def tool_latency(self, instance_id: str, call: int) -> float:
        return self.tool_median_s * self.rng("tool", instance_id, call).lognormvariate(0, self.tool_sigma)


@dataclass
class _Request:
    ids: list[int]
    future: asyncio.Future[list[Generation]]
    finish: str
    stop: int | None
    done: int = 0


class SimulatedEngine(RolloutEngine):
    """Continuous batching with a fixed cost per decode step. Steps follow a fixed cadence (each ends
    ``step_s`` after the previous one while there is work), as on an accelerator that runs steps
    back to back: event-loop timer jitter is not charged to the rollout loop."""

    name = "simulated"

    def __init__(self, tokenizer: Any, workload: Workload) -> None:
        self.tokenizer = tokenizer
        self.workload = workload
        self.tokens: dict[str, list[int]] = defaultdict(list)  # session -> generated tokens per call
        self.steps = 0
        self.batch_sizes: list[int] = []
        self.spans: dict[str, list[tuple[float, float]]] = defaultdict(list)  # session -> (request, done) times
        self._turn: dict[str, int] = defaultdict(int)
        self._script: dict[tuple[str, int], list[int]] = {}
        self._pending: list[_Request] = []
        self._running: list[_Request] = []
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def create(cls, source: ModelSource, config: Mapping[str, Any]) -> SimulatedEngine:
        return cls(source.tokenizer, Workload(**config))

    def prepare(self, sessions: Sequence[str]) -> None:
        """Tokenize every turn's text up front: a real engine's tokens come from the model, so the
        simulation's own tokenizing must not load the event loop the rollout runs on."""
        for session in sessions:
            for turn in range(TURNS):
                text = self.workload.text(session, turn)
                self._script[session, turn] = self.tokenizer.encode(text, add_special_tokens=False)

    async def generate(self, prompt_ids: list[int], params: SamplingParams, n: int = 1,
                       session_id: str | None = None) -> list[Generation]:
        if n != 1 or session_id is None:
            raise ValueError("the simulated engine serves one sample per trajectory turn")
        loop = asyncio.get_running_loop()
        if self._task is None:
            self._wake = asyncio.Event()
            self._task = loop.create_task(self._run())
        arrived = time.perf_counter()
        turn = self._turn[session_id]
        self._turn[session_id] += 1
        ids = list(self._script[session_id, turn])
        if len(ids) >= params.max_new_tokens:
            ids, finish, stop = ids[: params.max_new_tokens], "length", None
        else:
            ids, finish, stop = ids + [params.stop_token_ids[0]], "stop", params.stop_token_ids[0]
        self.tokens[session_id].append(len(ids))
        req = _Request(ids, loop.create_future(), finish, stop)
        self._pending.append(req)
        assert self._wake is not None
        self._wake.set()
        out = await req.future
        self.spans[session_id].append((arrived, time.perf_counter()))
        return out

    async def _run(self) -> None:
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        deadline = 0.0
        while True:
            if not self._pending and not self._running:
                self._wake.clear()
                await self._wake.wait()
                deadline = loop.time()  # an idle engine starts a step at once
            self._running += self._pending  # joins at this step; later arrivals wait for the next
            self._pending = []
            deadline = max(deadline + self.workload.step_s, loop.time())
            await asyncio.sleep(deadline - loop.time())
            self.steps += 1
            self.batch_sizes.append(len(self._running))
            still = []
            for req in self._running:
                req.done += 1
                if req.done < len(req.ids):
                    still.append(req)
                else:
                    req.future.set_result([Generation(req.ids, [-1.0] * len(req.ids), req.finish, req.stop)])
            self._running = still

    def update_weights(self, state_dict: Mapping[str, Any]) -> None:
        raise NotImplementedError("the simulated engine has no weights")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()


class HeavyTailTool(Tool):
    """A search-like tool whose latency is heavy-tailed (lognormal), fixed per (trajectory, call)."""

    schema = {"type": "function", "function": {
        "name": "search", "description": "Search the web.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"],
                       "additionalProperties": False}}}

    def __init__(self, workload: Workload) -> None:
        super().__init__({"timeout": 600})
        self.workload = workload
        self.slept: dict[str, list[float]] = defaultdict(list)  # trajectory -> latency of each call
        self.spans: dict[str, list[tuple[float, float]]] = defaultdict(list)  # trajectory -> (start, end) times

    async def execute(self, instance_id: str, arguments: dict[str, Any], **kw: Any) -> tuple[str, float, dict]:
        state = self.state(instance_id)
        call = state.get("calls", 0)
        state["calls"] = call + 1
        latency = self.workload.tool_latency(instance_id, call)
        trajectory = instance_id.rsplit(":", 1)[0]
        self.slept[trajectory].append(latency)
        start = time.perf_counter()
        await asyncio.sleep(latency)
        self.spans[trajectory].append((start, time.perf_counter()))
        return f"Top result for {arguments['query']!r}: 42", 0.0, {}


def samples() -> list[Sample]:
    return [Sample(prompt=[{"role": "user", "content": f"Question {i}: look it up and answer."}], index=i,
                   ground_truth="42") for i in range(PROMPTS)]


def trajectory_ids(batch: Sequence[Sample], n: int = N) -> list[str]:
    """The ids ``run_rollouts`` gives (no prefix); the baseline uses the same ones."""
    return [root_id("", sample.index, g, k) for g, sample in enumerate(batch) for k in range(n)]


def context(tokenizer: Any, engine: RolloutEngine, tool: Tool) -> RolloutContext:
    config = RolloutConfig(n=N, max_turns=TURNS, max_new_tokens=4096, max_response_tokens=16384,
                           max_concurrent_trajectories=PROMPTS * N)
    route = Route({"search": tool}, TURNS, HermesParser(), [], RewardConfig())
    return RolloutContext(engine=engine, renderer_factory=lambda schemas: ChatRenderer(tokenizer, schemas),
                          config=config, routes={None: route})


@dataclass
class _State:
    tid: str
    toolset: ToolSet
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    done: bool = False


async def batch_synchronous(ctx: RolloutContext, batch: Sequence[Sample], n: int) -> dict[str, list[int]]:
    """The baseline: turn by turn, all generations, then all tool calls; returns response ids."""
    cfg, task = ctx.config, ctx.routes[None]
    renderer = ctx.renderer(task)
    states = [_State(tid, ToolSet(task.tools, sample.tools_kwargs, tid),
                     renderer.prompt_ids([m.to_template() for m in sample.prompt]))
              for tid, sample in zip(trajectory_ids(batch, n), (s for s in batch for _ in range(n)))]
    await asyncio.gather(*(s.toolset.start() for s in states))
    for turn in range(task.max_turns):
        live = [s for s in states if not s.done]
        if not live:
            break
        params = SamplingParams(temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens,
                                stop_token_ids=[renderer.eos_id])
        gens = await asyncio.gather(*(ctx.engine.generate(s.prompt_ids + s.response_ids, params, 1, session_id=s.tid)
                                      for s in live))
        calls = []
        for s, gen in zip(live, gens):
            s.response_ids += gen[0].token_ids
            parsed = task.parser.parse(renderer.decode(gen[0].token_ids))
            calls.append(parsed.calls[: cfg.max_parallel_calls])
            s.done = not parsed.calls or turn + 1 >= task.max_turns
        results = await asyncio.gather(*(asyncio.gather(*(s.toolset.call(c) for c in cs))
                                         for s, cs in zip(live, calls)))
        for s, rs in zip(live, results):
            if s.done:
                continue
            texts = [(r.name, renderer.truncate(r.response.text, cfg.tool_response_max_tokens,
                                                cfg.tool_response_truncation)) for r in rs]
            s.response_ids += renderer.tool_delta([renderer.tool_message(t, name) for name, t in texts])
    await asyncio.gather(*(s.toolset.finish() for s in states))
    return {s.tid: s.response_ids for s in states}


@dataclass
class Result:
    seed: int
    bound_s: float
    continuous_s: float
    batch_sync_s: float
    batch_sync_bound_s: float
    steps: int
    mean_batch: float
    overhead: dict[str, float]  # where the last trajectory to finish spent time beyond its own work


def breakdown(engine: SimulatedEngine, tool: HeavyTailTool, t0: float, wall: float, step_s: float) -> dict[str, float]:
    """The last-finishing trajectory of toolrl's run, from start to the end of ``run_rollouts``:
    its own work (generation alone, tool latencies) plus what came on top of it."""
    last = max(engine.spans, key=lambda tid: engine.spans[tid][-1][1])
    gens, tools = engine.spans[last], tool.spans[last]
    gen_s, tool_s = sum(b - a for a, b in gens), sum(b - a for a, b in tools)
    alone_gen, alone_tool = sum(engine.tokens[last]) * step_s, sum(tool.slept[last])
    return {
        "own work s": alone_gen + alone_tool,
        "start ms": 1000 * (gens[0][0] - t0),  # rendering prompts, creating tools before the first request
        "engine wait ms": 1000 * (gen_s - alone_gen),  # waiting for a step boundary
        "tool overshoot ms": 1000 * (tool_s - alone_tool),  # asyncio timer lateness
        "loop ms": 1000 * (gens[-1][1] - gens[0][0] - gen_s - tool_s),  # parse, validate, render deltas, loop queue
        "end ms": 1000 * (t0 + wall - gens[-1][1]),  # scoring, calc_reward/release, gather
    }


async def run_seed(tokenizer: Any, workload: Workload) -> Result:
    batch = samples()

    # toolrl's loop.
    engine, tool = SimulatedEngine(tokenizer, workload), HeavyTailTool(workload)
    engine.prepare(trajectory_ids(batch))
    ctx = context(tokenizer, engine, tool)
    ctx.renderer(ctx.routes[None])  # built once per run in practice (jinja compile), not per step
    t0 = time.perf_counter()
    trajs: list[Trajectory] = await run_rollouts(ctx, batch, N, seed=workload.seed)
    continuous = time.perf_counter() - t0
    await engine.close()
    bad = [t for t in trajs if t.error or t.termination != "answered" or t.turns != TURNS]
    if bad:
        raise SystemExit(f"unexpected trajectory: {bad[0].termination} {bad[0].error} turns={bad[0].turns}")
    per_traj = {tid: sum(n) * workload.step_s + sum(tool.slept[tid]) for tid, n in engine.tokens.items()}
    bound = max(per_traj.values())
    steps, batches = engine.steps, engine.batch_sizes
    overhead = breakdown(engine, tool, t0, continuous, workload.step_s)

    # The batch-synchronous baseline, on a fresh engine and tool with the same workload.
    engine2, tool2 = SimulatedEngine(tokenizer, workload), HeavyTailTool(workload)
    engine2.prepare(trajectory_ids(batch))
    ctx2 = context(tokenizer, engine2, tool2)
    ctx2.renderer(ctx2.routes[None])
    t0 = time.perf_counter()
    responses = await batch_synchronous(ctx2, batch, N)
    batch_sync = time.perf_counter() - t0
    await engine2.close()
    if {t.trajectory_id: t.response_ids for t in trajs} != responses:
        raise SystemExit("the two loops produced different tokens: they did not do the same work")
    gen_max = [max(n[k] for n in engine2.tokens.values()) * workload.step_s for k in range(TURNS)]
    tool_max = [max(s[k] for s in tool2.slept.values()) for k in range(TURNS - 1)]
    return Result(workload.seed, bound, continuous, batch_sync, sum(gen_max) + sum(tool_max), steps,
                  sum(batches) / max(len(batches), 1), overhead)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--step-ms", type=float, default=3.0, help="decode step time")
    ap.add_argument("--tool-median-ms", type=float, default=150.0)
    ap.add_argument("--tool-sigma", type=float, default=1.0)
    args = ap.parse_args(argv)

    tokenizer = qwen_tokenizer("qwen3")
    print(f"machine: {machine()}")
    print(f"workload: {PROMPTS} prompts × {N} = {PROMPTS * N} trajectories × {TURNS} turns; decode step "
          f"{args.step_ms:g} ms (any batch size); reasoning 20 + 50·lognormal(0, 1) tokens per turn; tool latency "
          f"{args.tool_median_ms:g} ms·lognormal(0, {args.tool_sigma:g})\n")
    results = []
    for seed in args.seeds:
        w = Workload(seed, step_s=args.step_ms / 1000, tool_median_s=args.tool_median_ms / 1000,
                     tool_sigma=args.tool_sigma)
        results.append(asyncio.run(run_seed(tokenizer, w)))

    rows = [[r.seed, r.bound_s, r.continuous_s, r.continuous_s / r.bound_s, r.batch_sync_bound_s, r.batch_sync_s,
             r.batch_sync_s / r.continuous_s, r.steps, r.mean_batch] for r in results]
    total = [sum(getattr(r, k) for r in results) for k in ("bound_s", "continuous_s", "batch_sync_bound_s",
                                                            "batch_sync_s")]
    rows.append(["all", total[0], total[1], total[1] / total[0], total[2], total[3], total[3] / total[1], "", ""])
    print(table(["seed", "bound s", "toolrl s", "toolrl/bound", "sync bound s", "sync s", "sync/toolrl",
                 "steps", "mean batch"], rows))
    keys = list(results[0].overhead)
    print("\nlast trajectory to finish in toolrl's run: its own work and what came on top")
    print(table(["seed", *keys], [[r.seed, *(r.overhead[k] for k in keys)] for r in results]))
    over, speedup = total[1] / total[0], total[3] / total[1]
    print(f"\ntoolrl continuous / critical-path bound = {over:.3f}  (goal <= 1.15: {'met' if over <= 1.15 else 'MISSED'})")
    print(f"batch-synchronous / toolrl continuous    = {speedup:.3f}  (goal >= 2: {'met' if speedup >= 2 else 'MISSED'};"
          f" ideal for this workload: sync bound / critical-path bound = {total[2] / total[0]:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
