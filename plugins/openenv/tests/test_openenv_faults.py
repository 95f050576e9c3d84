"""A server that hangs or dies mid-run ends the trajectories it serves at once as infrastructure
failures (``infra_error``: no reward, not trained, never a made-up 0); the run completes, and every
episode is closed."""

from __future__ import annotations

import asyncio
import os
import signal
import time

from support import ENVS, call, close, rollout, routes, tokenizer
from toolrl.testing import ScriptedEngine


class Gate(ScriptedEngine):
    """Holds every trajectory's first generation until all have reset, then stops the server."""

    def __init__(self, count: int, pid: int) -> None:
        super().__init__(tokenizer(), {})
        self.count, self.pid, self.all_reset = count, pid, asyncio.Event()

    async def generate(self, prompt_ids, params, n=1, session_id=None):
        if session_id not in self.turns:
            self.count -= 1
            if self.count == 0:
                os.kill(self.pid, signal.SIGSTOP)
                self.all_reset.set()
            await self.all_reset.wait()
        return await super().generate(prompt_ids, params, n, session_id)


async def test_hung_then_killed_server_gives_errors_and_the_run_completes() -> None:
    options = {"app": "ledger_env:app", "app_dir": str(ENVS), "message_timeout_s": 2, "connect_timeout_s": 2}
    built = await routes(options)
    [kind] = [p for p in built[1] if hasattr(p, "shared")]
    _, local = await kind.shared.get("server", None)
    try:
        rows = [{"extra_info": {"reset_kwargs": {"target": 100}}} for _ in range(8)]
        before = await rollout(options, rows, {"s": [call("deposit", amount=1), "Done."]}, built=built)
        assert all(t.tool_results[0].status == "ok" and t.reward == 0.0 for t in before)

        # Every episode open, then the server hangs (SIGSTOP): the first call times out and ends each one.
        hung = {"s": [call("deposit", amount=1), call("deposit", amount=1), "Done."]}
        t0 = time.monotonic()
        during = await rollout(options, rows, hung, built=built, engine=Gate(len(rows), local.process.pid))
        assert time.monotonic() - t0 < 60
        for t in during:
            assert [r.status for r in t.tool_results] == ["infra_error"], t.tool_results
            assert "timed out" in t.tool_results[0].response.text and t.termination == "infra_error"
            assert t.turns == 1 and "openenv" not in t.reward_terms

        # ...then dies: a new trajectory's reset fails, an error with nothing run, never a hang.
        os.kill(local.process.pid, signal.SIGKILL)
        local.process.wait()
        after = await rollout(options, rows, hung, built=built)
        for t in after:  # the reset fails: an infrastructure failure, with nothing run
            assert t.termination == "infra_error" and "reset" in t.error and not t.tool_results
        slots = await kind.shared.get("slots", None)
        assert slots.held == 0  # every episode closed
    finally:
        await close(built[1])
