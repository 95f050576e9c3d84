"""A server that hangs or dies mid-run gives error results and error rewards; the run completes."""

from __future__ import annotations

import asyncio
import os
import signal
import time

from support import ENVS, build, close_all, trajectory
from toolrl.schemas import ToolCall
from toolrl.tools import ToolSet


async def test_hung_then_killed_server_gives_errors_and_the_run_completes() -> None:
    tools = await build({"app": "ledger_env:app", "app_dir": str(ENVS), "message_timeout_s": 2,
                         "connect_timeout_s": 2}, timeout=10)
    process = tools["deposit"].binding.local.process
    try:
        started = [trajectory(tools, [("deposit", {"amount": 1})], create_kwargs={"target": 100},
                              trajectory_id=f"a{i}", lifecycle_timeout=10) for i in range(8)]
        before = await asyncio.gather(*started)
        assert all(r[0][0].status == "ok" for r in before)

        # Sessions open, then the server hangs (SIGSTOP): calls time out as error results.
        toolsets = [ToolSet(tools, None, f"b{i}", lifecycle_timeout=10) for i in range(8)]
        await asyncio.gather(*(t.start() for t in toolsets))
        os.kill(process.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        hung = await asyncio.gather(*(t.call(ToolCall(name="deposit", arguments={"amount": 1})) for t in toolsets))
        assert time.monotonic() - t0 < 15
        assert all(r.status == "error" and "timed out" in r.response.text for r in hung), hung
        # ...then dies: the later calls and the rewards are errors, never a hang.
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        rewards = await asyncio.gather(*(t.finish() for t in toolsets))
        assert all(r == {"balance": 0.0} for r in rewards)  # no reward from the failed sessions
        assert all("no reward" in t.finish_errors["deposit"] for t in toolsets)

        t0 = time.monotonic()
        after = await asyncio.gather(*(trajectory(tools, [("deposit", {"amount": 1})], trajectory_id=f"c{i}",
                                                  lifecycle_timeout=10) for i in range(8)))
        assert time.monotonic() - t0 < 30
        for results, rewards, toolset in after:
            assert results[0].status == "error" and "unavailable" in results[0].response.text
            assert toolset.create_errors and rewards == {}
        assert len(tools["deposit"].binding.sessions.open) == 0
    finally:
        await close_all(tools)
