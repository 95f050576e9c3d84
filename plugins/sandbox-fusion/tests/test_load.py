"""At load: the HTTP client's one pool per server and its admission deadline; the embedded sandbox's warm
pool (ready workers handed out, a dead one replaced, idle ones reaped, none kept at size 0). The ladder
itself (16 to 1024 sessions) is ``benchmarks/env_load.py``; what a worker leaves behind never reaching the
next run is test_embedded.py's ``test_a_process_is_never_reused``."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time

import pytest
from sandbox_support import fake_spawn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from toolrl.schemas import ToolCall
from toolrl.tools import ToolSet
from toolrl_sandbox_fusion.client import SandboxFusionClient, SandboxRequestError, pools
from toolrl_sandbox_fusion.embedded.pool import ProcessPool
from toolrl_sandbox_fusion.models import RunCodeRequest
from toolrl_sandbox_fusion.tool import CodeInterpreterTool


class Stub:
    """``/run_code`` answering a clean run after ``delay_s``; counts the requests in flight at once."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s, self.in_flight, self.most_in_flight, self.calls = delay_s, 0, 0, 0

        async def run_code(request: Request) -> JSONResponse:
            body = await request.json()
            self.calls += 1
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            try:
                await asyncio.sleep(self.delay_s)
            finally:
                self.in_flight -= 1
            return JSONResponse({"status": "Success", "message": "", "run_result": {
                "status": "Finished", "execution_time": 0.0, "return_code": 0, "stdout": body["code"] + "\n",
                "stderr": ""}})

        self.app = Starlette(routes=[Route("/run_code", run_code, methods=["POST"])])


async def test_64_sessions_share_one_bounded_pool_and_none_is_lost(serve_app):
    stub = Stub(0.01)
    url = serve_app(stub.app)
    # Two routes' tools on one server: one pool between them, sized by the first (4 connections).
    tools = [CodeInterpreterTool({"sandbox_fusion_url": url, "rate_limit": None, "num_workers": 4}),
             CodeInterpreterTool({"sandbox_fusion_url": url + "/run_code", "rate_limit": None, "num_workers": 16})]
    seen_pools: set[int] = set()

    async def session(i: int) -> list[str]:
        toolset = ToolSet({"code_interpreter": tools[i % 2]}, trajectory_id=f"t{i}")
        await toolset.start()
        texts = []
        for step in range(2):
            result = await toolset.call(ToolCall(name="code_interpreter", arguments={"code": f"{i}-{step}"}))
            assert result.status == "ok", result
            texts.append(result.response.text)
            seen_pools.update(id(p) for p in pools().values())
        await toolset.finish()
        return texts

    try:
        done = await asyncio.gather(*(session(i) for i in range(64)))
        assert done == [[f"{i}-0", f"{i}-1"] for i in range(64)]  # none lost, none mixed up
        assert len(seen_pools) == 1 and len(pools()) == 1
        assert stub.calls == 128 and stub.most_in_flight <= 4  # admission: never more than its connections
    finally:
        for tool in tools:
            await tool.close()
    assert pools() == {}  # the last client to leave closed it


async def test_a_call_waits_for_a_connection_at_most_queue_timeout(serve_app):
    url = serve_app(Stub(0.5).app)
    client = SandboxFusionClient(url, max_connections=1, queue_timeout_s=0.2)
    try:
        first = asyncio.ensure_future(client.run_code(RunCodeRequest(code="a", language="python")))
        await asyncio.sleep(0.05)
        start = time.monotonic()
        with pytest.raises(SandboxRequestError, match="no connection free within 0.2 s"):
            await client.run_code(RunCodeRequest(code="b", language="python"))
        assert time.monotonic() - start < 0.6  # back-pressure with a deadline, not a queue without end
        response, attempts = await first
        assert attempts == 1 and response.run_result.stdout == "a\n"
    finally:
        await client.aclose()


def wait_for(condition, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_warm_pool_hands_out_ready_workers_replaces_a_killed_one_and_reaps_idle_ones():
    spawned: list[subprocess.Popen] = []
    pool = ProcessPool(lambda: fake_spawn(spawned), size=2, refill_delay=0.01, idle_timeout=0.5)
    try:
        pool.warm()
        wait_for(lambda: len(pool._ready) == 2)
        before = time.monotonic()
        worker = pool.take(10)
        assert worker.started < before and worker.proc.poll() is None  # warm: started before it was asked for
        pool.done(worker)
        wait_for(lambda: len(pool._ready) == 2)
        assert worker.proc not in [sp.proc for sp in pool._ready]  # never handed out twice
        victim = pool._ready[0]
        os.kill(victim.proc.pid, signal.SIGKILL)  # a ready worker dies while it waits
        os.waitid(os.P_PID, victim.proc.pid, os.WEXITED | os.WNOWAIT)  # dead (not reaped: the pool sees it)
        taken = pool.take(10)
        assert taken is not victim and taken.proc.poll() is None
        pool.done(taken)
        wait_for(lambda: pool.replaced == 1 and len(pool._ready) == 2 and
                 all(sp.proc.poll() is None for sp in pool._ready))
        wait_for(lambda: pool.reaped == 1 and len(pool._ready) == 1, timeout_s=5)  # idle: one kept ready
    finally:
        pool.close()
    assert all(p.poll() is not None for p in spawned)


def test_size_zero_starts_a_worker_per_take_and_keeps_none():
    spawned: list[subprocess.Popen] = []
    pool = ProcessPool(lambda: fake_spawn(spawned), size=0, refill_delay=0.01)
    try:
        time.sleep(0.3)
        assert spawned == []
        worker = pool.take(10)  # cold: started for this take
        pool.done(worker)
        time.sleep(0.3)
        assert len(spawned) == 1 and not pool._ready
    finally:
        pool.close()
