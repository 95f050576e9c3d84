"""Environments under load: N concurrent sessions through the rollout's own client code, a scripted policy.

    OMP_NUM_THREADS=1 python benchmarks/env_load.py [--env openenv,sandbox] [--ladder 16,128,1024]
        [--steps 5] [--think-s 1.0] [--exec-ms 5] [--json out.json]
    OMP_NUM_THREADS=1 python benchmarks/env_load.py --warm-pool [--calls 40]   # the embedded sandbox's pool

No model: each session is driven by a script, the way the rollout loop drives it, against loopback servers
this benchmark starts itself (one process per server, kept across the ladder):

- ``openenv``: the ``openenv`` session kind (``toolrl_openenv``) through core's :class:`SessionRun`
  (build, reset, ``step`` per call, score and close), on an OpenEnv server (``create_app`` of a counter
  environment, capacity 8192) — one WebSocket per episode, as OpenEnv's protocol has it;
- ``sandbox``: the ``code_interpreter`` tool (``toolrl_sandbox_fusion``) with ``sandbox_fusion_url``,
  through core's :class:`ToolSet` (create, call per step, calc_reward and release), on a stand-in
  SandboxFusion server whose ``/run_code`` answers after ``--exec-ms`` (it runs no code: the client and
  its connection pool are what is measured, not a sandbox).

Each rung runs in a fresh child process (its memory its own): every session opens (reset), then, all
open, the client's RSS is read (per open session: the RSS beyond the rung's warm-up, divided by N; the
payloads here are a few hundred bytes), then each session takes ``--steps`` steps with a think time
drawn from [0.5, 1.5] x ``--think-s`` between them (a model's generation time: the offered load is
N / think-s steps/s), then closes. Printed per rung: throughput (session steps/s), p50/p99 step latency,
KiB per open session, errors by kind, sessions lost (any that did not finish cleanly). Last lines:
``sessions held @1024: ...`` and ``p99 @1024 / p99 @16: ...``.

``--warm-pool``: the embedded sandbox (bubblewrap when installed) per call, started cold (a process
spawned for the call) against warm (taken from the pool of ready workers); prints
``warm/cold sandbox start: X.XX``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import resource
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from _common import free_port, machine, single_thread, table  # noqa: E402

single_thread()

OPENENV_CAPACITY = 8192


# -- the loopback servers (child processes) -------------------------------------------------------------

def openenv_app() -> Any:
    """A counter environment served by OpenEnv's own ``create_app`` (WebSocket sessions)."""
    from openenv.core.env_server.http_server import create_app
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation, State

    class Add(Action):
        amount: int = 1

    class Total(Observation):
        total: int = 0

    class Counter_(Environment):
        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self) -> None:
            super().__init__()
            self.total, self._state = 0, State(step_count=0)

        def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> Total:
            self.total, self._state = 0, State(episode_id=episode_id, step_count=0)
            return Total(total=0, done=False, reward=None)

        def step(self, action: Add, timeout_s: float | None = None, **kwargs: Any) -> Total:
            self.total += action.amount
            self._state.step_count += 1
            return Total(total=self.total, done=False, reward=float(self.total))

        @property
        def state(self) -> State:
            return self._state

    return create_app(Counter_, Add, Total, env_name="counter", max_concurrent_envs=OPENENV_CAPACITY)


def sandbox_stub_app(exec_ms: float) -> Any:
    """``POST /run_code`` answering as SandboxFusion does for a clean run, after ``exec_ms``."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def run_code(request: Request) -> JSONResponse:
        body = await request.json()
        await asyncio.sleep(exec_ms / 1000)
        return JSONResponse({"status": "Success", "message": "", "compile_result": None, "files": {},
                             "run_result": {"status": "Finished", "execution_time": exec_ms / 1000,
                                            "return_code": 0, "stdout": body["code"][-32:] + "\n",
                                            "stderr": ""}})

    return Starlette(routes=[Route("/run_code", run_code, methods=["POST"])])


def serve(kind: str, port: int, exec_ms: float) -> None:
    import threading

    import uvicorn

    parent = os.getppid()

    def orphaned() -> None:  # the benchmark died (killed, timed out): so does its server
        while os.getppid() == parent:
            time.sleep(1)
        os._exit(0)

    threading.Thread(target=orphaned, daemon=True).start()

    app = openenv_app() if kind == "openenv" else sandbox_stub_app(exec_ms)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="error", backlog=8192, timeout_keep_alive=60)


class Server:
    def __init__(self, kind: str, exec_ms: float) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen([sys.executable, __file__, "--serve", kind, "--port", str(self.port),
                                         "--exec-ms", str(exec_ms)], start_new_session=True)
        import httpx

        deadline = time.monotonic() + 120
        path = "/health" if kind == "openenv" else "/docs"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"the {kind} server exited ({self.process.returncode})")
            try:
                httpx.get(self.url + path, timeout=2)
                return
            except httpx.HTTPError:
                time.sleep(0.25)
        raise SystemExit(f"the {kind} server did not start")

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


# -- one rung (in a child process) ----------------------------------------------------------------------

def rss_kib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1024


def kind_of(error: BaseException | str) -> str:
    text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    for word in ("timed out", "CAPACITY", "Connect", "closed", "refused", "PoolTimeout", "HTTP 5", "HTTP 4"):
        if word.lower() in text.lower():
            return word
    return text.split(":")[0][:40] if isinstance(error, str) else type(error).__name__


class OpenEnvDriver:
    """A trajectory's OpenEnv session as the rollout drives one (toolrl.sessions.SessionRun)."""

    def __init__(self, url: str, options: dict[str, Any]) -> None:
        from toolrl.sessions import SessionKind

        self.kind = SessionKind.resolve("openenv", {"base_url": url, "max_sessions": OPENENV_CAPACITY, **options},
                                        Path.cwd())

    async def prepare(self) -> None:
        await self.kind.prepare()

    async def open(self, i: int) -> Any:
        from toolrl.schemas import Sample
        from toolrl.sessions import SessionRun

        run = SessionRun(self.kind, f"t{i}")
        await run.reset(Sample.model_validate({"prompt": "count", "index": i}))
        if run.error is not None:
            raise RuntimeError(run.error)
        return run

    async def step(self, run: Any, i: int) -> None:
        from toolrl.schemas import ToolCall

        result = await run.step(ToolCall(name="step", arguments={"amount": 1}))
        if result.response.is_error:
            raise RuntimeError(result.response.text)

    async def close(self, run: Any) -> None:
        from toolrl.trajectory import Trajectory

        traj = Trajectory(trajectory_id="t", sample_index=0, group=0, prompt_ids=[])
        await run.finish(traj)
        if traj.error:
            raise RuntimeError(traj.error)

    async def shutdown(self) -> None:
        await self.kind.close()


class SandboxDriver:
    """A trajectory's ``code_interpreter`` as the rollout drives a tool (toolrl.tools.ToolSet)."""

    def __init__(self, url: str, options: dict[str, Any]) -> None:
        from toolrl_sandbox_fusion.tool import CodeInterpreterTool

        self.tool = CodeInterpreterTool({"sandbox_fusion_url": url, "rate_limit": None, "num_workers": 64, **options})

    async def prepare(self) -> None:
        pass

    async def open(self, i: int) -> Any:
        from toolrl.tools import ToolSet

        tools = ToolSet({"code_interpreter": self.tool}, trajectory_id=f"t{i}")
        await tools.start()
        if tools.create_errors:
            raise RuntimeError(str(tools.create_errors))
        return tools

    async def step(self, tools: Any, i: int) -> None:
        from toolrl.schemas import ToolCall

        result = await tools.call(ToolCall(name="code_interpreter", arguments={"code": f"print({i})"}))
        if result.status != "ok":
            raise RuntimeError(f"{result.status}: {result.response.text[:200]}")

    async def close(self, tools: Any) -> None:
        await tools.finish()
        if tools.finish_errors:
            raise RuntimeError(str(tools.finish_errors))

    async def shutdown(self) -> None:
        await self.tool.close()


async def rung(env: str, url: str, n: int, steps: int, think_s: float, options: dict[str, Any]) -> dict[str, Any]:
    driver = (OpenEnvDriver if env == "openenv" else SandboxDriver)(url, options)
    await driver.prepare()
    errors: Counter[str] = Counter()
    latencies: list[float] = []
    rng = random.Random(n)

    async def warm(i: int) -> None:  # imports, the client's pool: not per-session memory
        s = await driver.open(-1 - i)
        await driver.step(s, 0)
        await driver.close(s)

    await asyncio.gather(*(warm(i) for i in range(min(n, 16))))
    gc.collect()
    base_rss = rss_kib()
    opened: dict[int, Any] = {}

    async def open_one(i: int) -> None:
        try:
            opened[i] = await driver.open(i)
        except Exception as exc:
            errors[f"reset: {kind_of(exc)}"] += 1

    start_open = time.perf_counter()
    await asyncio.gather(*(open_one(i) for i in range(n)))
    open_s = time.perf_counter() - start_open
    gc.collect()
    held_rss = rss_kib()
    lost = n - len(opened)

    async def drive(i: int, session: Any) -> bool:
        ok = True
        for _ in range(steps):
            await asyncio.sleep(think_s * rng.uniform(0.5, 1.5))
            t0 = time.perf_counter()
            try:
                await driver.step(session, i)
            except Exception as exc:
                errors[f"step: {kind_of(exc)}"] += 1
                ok = False
                break
            latencies.append(time.perf_counter() - t0)
        try:
            await driver.close(session)
        except Exception as exc:
            errors[f"close: {kind_of(exc)}"] += 1
            ok = False
        return ok

    start = time.perf_counter()
    finished = await asyncio.gather(*(drive(i, s) for i, s in opened.items()))
    wall = time.perf_counter() - start
    await driver.shutdown()
    lost += sum(1 for ok in finished if not ok)
    latencies.sort()

    def pct(q: float) -> float:
        return latencies[min(len(latencies) - 1, int(q * (len(latencies) - 1)))] if latencies else float("nan")

    return {"env": env, "n": n, "steps": len(latencies), "wall_s": wall, "open_s": open_s,
            "steps_per_s": len(latencies) / wall if wall else 0.0, "p50_s": pct(0.5), "p99_s": pct(0.99),
            "kib_per_session": (held_rss - base_rss) / max(n, 1), "lost": lost, "errors": dict(errors),
            "offered_steps_per_s": n / think_s}


# -- the embedded sandbox's warm pool --------------------------------------------------------------------

def warm_pool(calls: int, isolation: str) -> dict[str, Any]:
    """Per call (``print(1+1)``, one at a time): the time to get a ready sandbox worker, from a pool of
    ready ones (warm, ``pool_size`` 4) or started for the call (cold, ``pool_size`` 0), and the whole
    call either way."""
    from toolrl_sandbox_fusion.embedded import EmbeddedSandbox, SandboxConfig
    from toolrl_sandbox_fusion.models import RunCodeRequest, RunStatus

    request = RunCodeRequest(code="print(1+1)", language="python")
    out: dict[str, list[float]] = {"cold_start": [], "warm_start": [], "cold_call": [], "warm_call": []}
    warm = EmbeddedSandbox(SandboxConfig(isolation=isolation, pool_size=4, max_concurrency=1))
    cold = EmbeddedSandbox(SandboxConfig(isolation=isolation, pool_size=0, max_concurrency=1))
    try:
        for name, sandbox in (("warm", warm), ("cold", cold)):
            assert sandbox.run(request).status == RunStatus.Success  # the pool built, the interpreter found
            pool = sandbox._pool("python")
            take, starts = pool.take, out[f"{name}_start"]

            def timed_take(timeout: float, take: Any = take, starts: list[float] = starts) -> Any:
                t0 = time.perf_counter()
                worker = take(timeout)
                starts.append(time.perf_counter() - t0)
                return worker

            pool.take = timed_take  # type: ignore[method-assign]
            starts.clear()
        warm.start()
        for _ in range(calls):
            for name, sandbox in (("warm", warm), ("cold", cold)):
                time.sleep(0.1)  # the warm pool refills in a quiet moment, as between a model's turns
                t0 = time.perf_counter()
                response = sandbox.run(request)
                out[f"{name}_call"].append(time.perf_counter() - t0)
                assert response.status == RunStatus.Success and response.run_result.stdout == "2\n", response
        mode = str(getattr(warm.mode, "value", warm.mode))
    finally:
        warm.close()
        cold.close()
    medians: dict[str, Any] = {k: sorted(v)[len(v) // 2] for k, v in out.items()}
    return {**medians, "isolation": mode}


# -- the parent ------------------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="openenv,sandbox", help="comma-separated: openenv, sandbox")
    parser.add_argument("--ladder", default="16,128,1024", help="session counts (4096 needs ulimit -n >= ~9000)")
    parser.add_argument("--steps", type=int, default=5, help="steps per session")
    parser.add_argument("--repeat", type=int, default=1, help="runs per rung (the median p99's is shown)")
    parser.add_argument("--think-s", type=float, default=1.0, help="mean think time between a session's steps")
    parser.add_argument("--exec-ms", type=float, default=5.0, help="the stand-in sandbox server's run time")
    parser.add_argument("--json", dest="json_out")
    parser.add_argument("--openenv-options", default="{}", help="JSON: more of the openenv session's options "
                        "(e.g. '{\"ws_compression\": true}')")
    parser.add_argument("--sandbox-options", default="{}", help="JSON: more of the code_interpreter tool's "
                        "options (default: rate_limit null, num_workers 64)")
    parser.add_argument("--warm-pool", action="store_true", help="only the embedded sandbox's cold vs warm start")
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--isolation", default="auto", choices=["auto", "bwrap", "unshare"])
    parser.add_argument("--serve", choices=["openenv", "sandbox"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--child", help=argparse.SUPPRESS)  # env,url,n
    args = parser.parse_args()

    if args.serve:
        serve(args.serve, args.port, args.exec_ms)
        return
    if args.child:
        env, url, n = args.child.split(",")
        options = json.loads(args.openenv_options if env == "openenv" else args.sandbox_options)
        print(json.dumps(asyncio.run(rung(env, url, int(n), args.steps, args.think_s, options))))
        return
    print(machine())
    if args.warm_pool:
        figures = warm_pool(args.calls, args.isolation)
        print(f"embedded sandbox ({figures['isolation']}), median of {args.calls} calls each:")
        print(table(["", "get a ready worker (ms)", "whole call print(1+1) (ms)"],
                    [["cold (spawned for the call)", 1000 * figures["cold_start"], 1000 * figures["cold_call"]],
                     ["warm (from the pool)", 1000 * figures["warm_start"], 1000 * figures["warm_call"]]]))
        print(f"warm/cold whole call: {figures['warm_call'] / figures['cold_call']:.2f}; start "
              f"{1000 * figures['warm_start']:.3f} / {1000 * figures['cold_start']:.1f} ms")
        print(f"warm/cold sandbox start: {figures['warm_start'] / figures['cold_start']:.2f}")
        return

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    ladder = [int(x) for x in args.ladder.split(",")]
    print(f"open files limit {soft} (hard {hard}); {args.steps} steps per session, think {args.think_s:g} s "
          f"(x U[0.5, 1.5]); sandbox stand-in runs {args.exec_ms:g} ms")
    results: list[dict[str, Any]] = []
    for env in args.env.split(","):
        server = Server(env, args.exec_ms)
        try:
            for n in ladder:
                # The client holds one socket per open OpenEnv session (the server another: own process).
                if n + 256 > soft:
                    print(f"{env} @{n}: skipped: needs ~{n + 256} open files, the limit is {soft}")
                    continue
                runs = []
                for _ in range(args.repeat):
                    res = subprocess.run([sys.executable, __file__, "--child", f"{env},{server.url},{n}",
                                          "--steps", str(args.steps), "--think-s", str(args.think_s),
                                          "--openenv-options", args.openenv_options,
                                          "--sandbox-options", args.sandbox_options],
                                         capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
                    if res.returncode != 0:
                        print(f"{env} @{n}: failed (exit {res.returncode}): {res.stderr[-1500:]}")
                        continue
                    runs.append(json.loads(res.stdout.strip().splitlines()[-1]))
                if runs:  # the run of median p99; sessions lost and errors summed over all
                    row = sorted(runs, key=lambda r: r["p99_s"])[len(runs) // 2]
                    row["lost"] = sum(r["lost"] for r in runs)
                    row["errors"] = dict(sum((Counter(r["errors"]) for r in runs), Counter()))
                    row["p99_runs"] = [r["p99_s"] for r in runs]
                    results.append(row)
        finally:
            server.stop()
    print(table(["env", "sessions", "offered steps/s", "steps/s", "p50 (s)", "p99 (s)", "p99 of each run",
                 "KiB/session", "lost", "errors"],
                [[r["env"], r["n"], r["offered_steps_per_s"], r["steps_per_s"], r["p50_s"], r["p99_s"],
                  " ".join(f"{p:.3f}" for p in r["p99_runs"]), r["kib_per_session"], r["lost"],
                  ", ".join(f"{k} x{v}" for k, v in r["errors"].items()) or "-"] for r in results]))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"machine": machine(), "results": results}, indent=1))
    top, bottom = (1024 if 1024 in ladder else max(ladder)), min(ladder)
    for env in args.env.split(","):
        by_n = {r["n"]: r for r in results if r["env"] == env}
        if top in by_n:
            hi = by_n[top]
            print(f"{env}: sessions held @{top}: {hi['lost']} lost, p99 {hi['p99_s']:.2f} s, "
                  f"{hi['kib_per_session']:.0f} KiB/session")
        if top in by_n and bottom in by_n and top != bottom:
            print(f"{env}: p99 @{top} / p99 @{bottom}: {by_n[top]['p99_s'] / by_n[bottom]['p99_s']:.2f}")


if __name__ == "__main__":
    main()
