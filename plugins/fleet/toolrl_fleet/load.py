"""Environments under load: N concurrent trajectories driven the way the rollout loop drives them, by a
scripted policy instead of a model (``toolrl env bench``, ``benchmarks/env_load.py``): how many sessions
an environment holds, served in-process or by a fleet.

A :class:`Driver` opens a trajectory (a session's reset through :class:`toolrl.sessions.SessionRun`, or
a :class:`toolrl.tools.ToolSet`'s create), takes steps and closes it; its ``prepare`` ends with the
rollout process's collector policy (:func:`toolrl.plugin_support.after_startup`), as a rollout's
start-up does. :func:`measure_rung` opens N at once, reads the client's memory with all of them open,
then has each take ``steps`` steps with a think time between them (a model's generation time) and
close. A failure the environment caused (:class:`toolrl.InfrastructureError`: its server gone) masks
its trajectory, which the rollout would not train; any other failure loses it."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

from pydantic import BaseModel
from toolrl import InfrastructureError
from toolrl.config import ConfigError
from toolrl.data.sources import load_split
from toolrl.environments import get_environment
from toolrl.plugin_support import after_startup
from toolrl.schemas import Sample, ToolCall
from toolrl.sessions import SessionKind, SessionRun
from toolrl.tools import Tool, ToolSet
from toolrl.tools.verl_config import build_tools, parse_tools_config
from toolrl.training.peakmem import rss_bytes
from toolrl.trajectory import Trajectory

ERROR_WORDS = ("gone", "timed out", "CAPACITY", "Connect", "closed", "refused", "PoolTimeout", "HTTP 5",
               "HTTP 4")


class Driver(Protocol):
    async def prepare(self) -> None: ...
    async def open(self, i: int) -> Any: ...
    async def step(self, handle: Any, i: int) -> bool: ...  # whether the trajectory goes on
    async def close(self, handle: Any) -> None: ...
    async def shutdown(self) -> None: ...


class RungResult(BaseModel):
    n: int
    steps: int
    wall_s: float
    open_s: float
    steps_per_s: float
    offered_steps_per_s: float
    p50_s: float
    p99_s: float
    kib_per_session: float
    completed: int
    masked: int  # ended by the environment's failure (infra_error: not trained)
    lost: int  # ended by any other failure
    errors: dict[str, int]


def kind_of(error: BaseException) -> str:
    """A short class of an error, for counting: a known word in it, else its type."""
    text = f"{type(error).__name__}: {error}".lower()
    return next((word for word in ERROR_WORDS if word.lower() in text), type(error).__name__)


Policy = Callable[[Sequence[Mapping[str, Any]], int], ToolCall]


def first_tool(schemas: Sequence[Mapping[str, Any]], i: int) -> ToolCall:
    """The default policy: call the first tool offered, each required argument a plain value of its type."""
    function = schemas[0].get("function", schemas[0])
    params = function.get("parameters") or {}
    plain = {"integer": 1, "number": 1.0, "boolean": False, "array": [], "object": {}}
    arguments = {name: plain.get((params.get("properties") or {}).get(name, {}).get("type"), str(i))
                 for name in params.get("required") or []}
    return ToolCall(name=function["name"], arguments=arguments)


class SessionDriver:
    """Trajectories of a session kind through :class:`SessionRun`, each reset with one of ``samples``."""

    def __init__(self, kind: SessionKind, samples: Sequence[Sample], policy: Policy = first_tool) -> None:
        self.kind, self.samples, self.policy = kind, samples, policy

    async def prepare(self) -> None:
        await self.kind.prepare()
        after_startup()  # as a rollout process once its routes are built

    async def open(self, i: int) -> tuple[SessionRun, list[dict[str, Any]]]:
        session_run = SessionRun(self.kind, f"t{i}")
        reset = await session_run.reset(self.samples[i % len(self.samples)])
        if session_run.error is not None:
            raise (InfrastructureError if session_run.infrastructure else RuntimeError)(session_run.error)
        schemas = [t.schema if isinstance(t, Tool) else t for t in reset.tools]
        if not schemas:
            raise RuntimeError(f"session {self.kind.name!r} hands out no tools to call")
        return session_run, schemas

    async def step(self, handle: tuple[SessionRun, list[dict[str, Any]]], i: int) -> bool:
        session_run, schemas = handle
        # A session's failure raises (masked when infrastructure).
        result = await session_run.step(self.policy(schemas, i))
        return not result.done

    async def close(self, handle: tuple[SessionRun, list[dict[str, Any]]]) -> None:
        traj = Trajectory(trajectory_id=handle[0].trajectory_id, sample_index=0, group=0, prompt_ids=[])
        await handle[0].finish(traj)
        if traj.error:
            raise (InfrastructureError if traj.termination == "infra_error" else RuntimeError)(traj.error)

    async def shutdown(self) -> None:
        await self.kind.close()


class ToolDriver:
    """Trajectories of tools through :class:`ToolSet` (create, a call per step, calc_reward, release)."""

    def __init__(self, tools: Mapping[str, Tool], samples: Sequence[Sample],
                 policy: Policy = first_tool) -> None:
        self.tools, self.samples, self.policy = dict(tools), samples, policy

    async def prepare(self) -> None:
        after_startup()  # as a rollout process once its routes are built

    async def open(self, i: int) -> ToolSet:
        tools = ToolSet(self.tools, self.samples[i % len(self.samples)].tools_kwargs, trajectory_id=f"t{i}")
        await tools.start()
        if tools.create_errors:
            raise (InfrastructureError if tools.infrastructure else RuntimeError)(str(tools.create_errors))
        return tools

    async def step(self, tools: ToolSet, i: int) -> bool:
        result = await tools.call(self.policy(tools.schemas(), i))
        if result.status == "infra_error":  # (Tool.call makes every other failure an error response)
            raise InfrastructureError(result.response.text)
        return True

    async def close(self, tools: ToolSet) -> None:
        await tools.finish()
        if tools.finish_errors:
            raise RuntimeError(str(tools.finish_errors))

    async def shutdown(self) -> None:
        await asyncio.gather(*(t.close() for t in self.tools.values() if hasattr(t, "close")))


async def _warm_up(driver: Driver, n: int) -> None:
    """Imports, the client's pools: not per-session memory."""
    async def one(i: int) -> None:
        handle = await driver.open(-1 - i)
        await driver.step(handle, 0)
        await driver.close(handle)

    await asyncio.gather(*(one(i) for i in range(min(n, 16))))


async def measure_rung(driver: Driver, n: int, steps: int, think_s: float,
                       during: Callable[[], Awaitable[None]] | None = None) -> RungResult:
    """N trajectories at once on a prepared ``driver`` (see the module); ``during`` runs beside the
    steps (a fault to inject)."""
    errors: Counter[str] = Counter()
    latencies: list[float] = []
    rng = random.Random(n)
    await _warm_up(driver, n)
    gc.collect()
    base_rss, opened = rss_bytes() or 0, {}
    outcome = {"masked": 0, "lost": 0}

    def failed(stage: str, exc: BaseException) -> None:
        errors[f"{stage}: {kind_of(exc)}"] += 1
        outcome["masked" if isinstance(exc, InfrastructureError) else "lost"] += 1

    async def open_one(i: int) -> None:
        try:
            opened[i] = await driver.open(i)
        except Exception as exc:
            failed("reset", exc)

    start = time.perf_counter()
    await asyncio.gather(*(open_one(i) for i in range(n)))
    open_s = time.perf_counter() - start
    gc.collect()
    held_rss = rss_bytes() or 0

    async def drive(i: int, handle: Any) -> None:
        try:
            for _ in range(steps):
                await asyncio.sleep(think_s * rng.uniform(0.5, 1.5))
                t0 = time.perf_counter()
                goes_on = await driver.step(handle, i)
                latencies.append(time.perf_counter() - t0)
                if not goes_on:
                    break
        except Exception as exc:
            failed("step", exc)
            # The rollout closes a failed trajectory too; its close's error is the failure's, counted once.
            with contextlib.suppress(Exception):
                await driver.close(handle)
            return
        try:
            await driver.close(handle)
        except Exception as exc:
            failed("close", exc)

    start = time.perf_counter()
    side = asyncio.ensure_future(during()) if during is not None else None
    await asyncio.gather(*(drive(i, h) for i, h in opened.items()))
    wall = time.perf_counter() - start
    if side is not None:
        await side
    latencies.sort()
    failures = outcome["masked"] + outcome["lost"]
    return RungResult(n=n, steps=len(latencies), wall_s=wall, open_s=open_s,
                      steps_per_s=len(latencies) / wall if wall else 0.0,
                      offered_steps_per_s=n / think_s if think_s else float("inf"),
                      p50_s=percentile(latencies, 0.5), p99_s=percentile(latencies, 0.99),
                      kib_per_session=(held_rss - base_rss) / 1024 / max(n, 1), completed=n - failures,
                      masked=outcome["masked"], lost=outcome["lost"], errors=dict(errors))


def percentile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * (len(sorted_values) - 1)))]


async def environment_driver(name: str, options: Mapping[str, Any], split: str | None = None,
                             session: str | None = None,
                             session_options: Mapping[str, Any] | None = None) -> Driver:
    """A driver of the registered environment ``name`` (adapted to ``options``) over its ``split``'s
    samples (default: its first): through its session (or ``session`` with ``session_options``: a kind
    that serves it elsewhere, ``fleet`` say) when it has one, else through its tools. A ConfigError
    names what is wrong."""
    env, validated = get_environment(name, "NAME").resolve(dict(options), "--options")
    split = split or next(iter(env.splits))
    samples = load_split(env, split, validated)  # never empty: an empty split is its ConfigError
    kind_name = session or env.session
    if kind_name is not None:
        kind_options = session_options if session is not None else env.session_options
        return SessionDriver(SessionKind.resolve(kind_name, kind_options, ".", where="--session",
                                                 options_where="--session-options"), samples)
    if not env.tools:
        raise ConfigError(f"NAME: environment {name!r} has neither a session nor tools to drive")
    return ToolDriver(await build_tools(parse_tools_config({"tools": env.tools})), samples)
