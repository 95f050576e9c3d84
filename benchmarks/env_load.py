"""Environments under load: N concurrent sessions through the rollout's own client code, a scripted policy.

    OMP_NUM_THREADS=1 python benchmarks/env_load.py [--env openenv,sandbox] [--ladder 16,128,1024]
        [--steps 5] [--think-s 1.0] [--exec-ms 5] [--json out.json]
    OMP_NUM_THREADS=1 python benchmarks/env_load.py --env fleet [--kill-at 2 --restart-after 1]  # kill/restart
    OMP_NUM_THREADS=1 python benchmarks/env_load.py --warm-pool [--calls 40]   # the embedded sandbox's pool

No model: each session is driven by a script, the way the rollout loop drives it, against loopback servers
this benchmark starts itself (one process per server, kept across the ladder):

- ``openenv``: the ``openenv`` session kind (``toolrl_openenv``) through core's :class:`SessionRun`
  (build, reset, ``step`` per call, score and close), on an OpenEnv server (``create_app`` of a counter
  environment, capacity 8192, with the collector policy the plugin gives the servers it starts:
  :mod:`toolrl.gc_policy`) — one WebSocket per episode, as OpenEnv's protocol has it;
- ``sandbox``: the ``code_interpreter`` tool (``toolrl_sandbox_fusion``) with ``sandbox_fusion_url``,
  through core's :class:`ToolSet` (create, call per step, calc_reward and release), on a stand-in
  SandboxFusion server whose ``/run_code`` answers after ``--exec-ms`` (it runs no code: the client and
  its connection pool are what is measured, not a sandbox);
- ``fleet``: the same OpenEnv sessions through the ``fleet`` session kind (``toolrl_fleet``), spread
  over ``--fleet-servers`` ``toolrl env serve openenv`` processes in front of that OpenEnv server. Server 0
  is killed (SIGKILL) ``--kill-at`` s into the steps and started again ``--restart-after`` s later: its
  sessions are masked (infrastructure failures), none elsewhere may be lost; then N new trajectories
  take a step each, and the line ``fleet @N: ...`` says how many completed and how many the restarted
  server took.

The measuring is the fleet plugin's (:mod:`toolrl_fleet.load`, which ``toolrl env bench`` runs too, so
every ``--env`` needs ``pip install -e plugins/fleet``; its drivers' ``prepare`` ends with the rollout
process's collector policy, as a rollout's start-up does). Each rung
runs in a fresh child process (its memory its own): every session opens (reset), then, all
open, the client's RSS is read (per open session: the RSS beyond the rung's warm-up, divided by N; the
payloads here are a few hundred bytes), then each session takes ``--steps`` steps with a think time
drawn from [0.5, 1.5] x ``--think-s`` between them (a model's generation time: the offered load is
N / think-s steps/s), then closes. Printed per rung: throughput (session steps/s), p50/p99 step latency,
KiB per open session, errors by kind, sessions masked (the environment failed: infra_error, not
trained) and lost (any other that did not finish cleanly). Last lines:
``sessions held @1024: ...`` and ``p99 @1024 / p99 @16: ...``.

``--warm-pool``: the embedded sandbox (bubblewrap when installed) per call, started cold (a process
spawned for the call) against warm (taken from the pool of ready workers); prints
``warm/cold sandbox start: X.XX``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
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
    if kind == "openenv":  # as the plugin runs the OpenEnv servers it starts (toolrl_openenv.serve)
        from toolrl.gc_policy import after_startup

        after_startup()
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

def openenv_driver(url: str, options: dict[str, Any], kind: str = "openenv") -> Any:
    """The ``openenv`` session kind through core's :class:`SessionRun` (``kind`` ``fleet``: the same,
    served by the fleet's servers, ``options`` its own)."""
    from toolrl.schemas import Sample, ToolCall
    from toolrl.sessions import SessionKind
    from toolrl_fleet.load import SessionDriver

    if kind == "openenv":
        options = {"base_url": url, "max_sessions": OPENENV_CAPACITY, **options}
    return SessionDriver(SessionKind.resolve(kind, options, Path.cwd()), [Sample.model_validate({"prompt": "count"})],
                         policy=lambda schemas, i: ToolCall(name="step", arguments={"amount": 1}))


def sandbox_driver(url: str, options: dict[str, Any]) -> Any:
    """The ``code_interpreter`` tool as the rollout drives a tool (core's :class:`ToolSet`)."""
    from toolrl.schemas import Sample, ToolCall
    from toolrl_fleet.load import ToolDriver
    from toolrl_sandbox_fusion.tool import CodeInterpreterTool

    tool = CodeInterpreterTool({"sandbox_fusion_url": url, "rate_limit": None, "num_workers": 64, **options})
    return ToolDriver({"code_interpreter": tool}, [Sample.model_validate({"prompt": "run"})],
                      policy=lambda schemas, i: ToolCall(name="code_interpreter", arguments={"code": f"print({i})"}))


class FleetServers:
    """``toolrl env serve openenv`` processes in front of the OpenEnv server, on fixed ports (one can be
    killed and started again on its own)."""

    def __init__(self, openenv_url: str, count: int) -> None:
        self.options = json.dumps({"base_url": openenv_url, "max_sessions": OPENENV_CAPACITY})
        self.ports = [free_port() for _ in range(count)]
        self.urls = [f"http://127.0.0.1:{p}" for p in self.ports]
        self.processes = [self.start(p) for p in self.ports]

    def start(self, port: int) -> subprocess.Popen[str]:
        process = subprocess.Popen([sys.executable, "-m", "toolrl", "env", "serve", "openenv", "--port", str(port),
                                    "--capacity", str(OPENENV_CAPACITY), "--options", self.options,
                                    "--until-stdin-closes"],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)
        assert process.stdout is not None
        if not process.stdout.readline().startswith("serving"):
            raise SystemExit(f"toolrl env serve openenv did not start (exit {process.wait()})")
        return process

    def kill(self, i: int) -> None:
        self.processes[i].kill()
        self.processes[i].wait()

    def restart(self, i: int) -> None:
        self.processes[i] = self.start(self.ports[i])

    def stop(self) -> None:
        for process in self.processes:
            process.kill()
            process.wait()


async def fleet_rung(url: str, n: int, steps: int, think_s: float, servers: int, kill_at: float,
                     restart_after: float) -> dict[str, Any]:
    """A rung over a fleet of ``servers``: the first killed (SIGKILL) ``kill_at`` s into the steps and
    started again ``restart_after`` s later; then N new trajectories take a step each, and count how
    many the restarted server took (the run goes on, the server back in it)."""
    from toolrl_fleet.load import measure_rung

    fleet = FleetServers(url, servers)
    driver = openenv_driver(url, {"urls": fleet.urls, "retry_s": 0.5, "queue_timeout_s": 30}, kind="fleet")
    held: dict[str, int] = {}
    try:
        await driver.prepare()
        members = (await driver.kind.shared.get("fleet", None)).members

        async def kill_and_restart() -> None:
            await asyncio.sleep(kill_at)
            held["at_kill"] = members[0].open
            fleet.kill(0)
            await asyncio.sleep(restart_after)
            await asyncio.to_thread(fleet.restart, 0)

        result = (await measure_rung(driver, n, steps, think_s, during=kill_and_restart)).model_dump()
        await asyncio.sleep(1.0)  # retry_s: the fleet asks the restarted server again
        taken = members[0].taken
        after = await measure_rung(driver, n, 1, 0.0)
        after_on_restarted = members[0].taken - taken
        await driver.shutdown()
    finally:
        fleet.stop()
    return {**result, "env": "fleet", "held_at_kill": held.get("at_kill", 0), "after_n": n,
            "after_completed": after.completed, "after_failed": after.lost + after.masked,
            "after_on_restarted": after_on_restarted}


async def rung(env: str, url: str, n: int, steps: int, think_s: float, options: dict[str, Any]) -> dict[str, Any]:
    from toolrl_fleet.load import measure_rung

    driver = openenv_driver(url, options) if env == "openenv" else sandbox_driver(url, options)
    await driver.prepare()
    try:
        result = await measure_rung(driver, n, steps, think_s)
    finally:
        await driver.shutdown()
    return {**result.model_dump(), "env": env}


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
    parser.add_argument("--env", default="openenv,sandbox", help="comma-separated: openenv, sandbox, fleet")
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
    parser.add_argument("--fleet-servers", type=int, default=2, help="fleet: environment servers in the fleet")
    parser.add_argument("--kill-at", type=float, default=2.0, help="fleet: seconds into the steps server 0 is killed")
    parser.add_argument("--restart-after", type=float, default=1.0, help="fleet: seconds until it is started again")
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
        if env == "fleet":
            print(json.dumps(asyncio.run(fleet_rung(url, int(n), args.steps, args.think_s, args.fleet_servers,
                                                    args.kill_at, args.restart_after))))
            return
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
        server = Server("openenv" if env == "fleet" else env, args.exec_ms)
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
                                          "--sandbox-options", args.sandbox_options,
                                          "--fleet-servers", str(args.fleet_servers), "--kill-at", str(args.kill_at),
                                          "--restart-after", str(args.restart_after)],
                                         capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
                    if res.returncode != 0:
                        print(f"{env} @{n}: failed (exit {res.returncode}): {res.stderr[-1500:]}")
                        continue
                    runs.append(json.loads(res.stdout.strip().splitlines()[-1]))
                if runs:  # the run of median p99; sessions lost and errors summed over all
                    row = sorted(runs, key=lambda r: r["p99_s"])[len(runs) // 2]
                    row["lost"] = sum(r["lost"] for r in runs)
                    row["masked"] = sum(r["masked"] for r in runs)
                    row["errors"] = dict(sum((Counter(r["errors"]) for r in runs), Counter()))
                    row["p99_runs"] = [r["p99_s"] for r in runs]
                    results.append(row)
        finally:
            server.stop()
    print(table(["env", "sessions", "offered steps/s", "steps/s", "p50 (s)", "p99 (s)", "p99 of each run",
                 "KiB/session", "masked", "lost", "errors"],
                [[r["env"], r["n"], r["offered_steps_per_s"], r["steps_per_s"], r["p50_s"], r["p99_s"],
                  " ".join(f"{p:.3f}" for p in r["p99_runs"]), r["kib_per_session"], r["masked"], r["lost"],
                  ", ".join(f"{k} x{v}" for k, v in r["errors"].items()) or "-"] for r in results]))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"machine": machine(), "results": results}, indent=1))
    for r in (r for r in results if r["env"] == "fleet"):  # the run of median p99's
        print(f"fleet @{r['n']}: server 0 of {args.fleet_servers} killed at {args.kill_at:g} s holding "
              f"{r['held_at_kill']} sessions, restarted {args.restart_after:g} s later: {r['masked']} masked, "
              f"{r['lost']} lost, {r['completed']} completed; then {r['after_n']} new: {r['after_completed']} "
              f"completed, {r['after_failed']} failed, {r['after_on_restarted']} on the restarted server")
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
