"""The agents' loop (toolrl.gateway.agent_loop): closing it never blocks the loop that serves the gateway."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from toolrl.gateway.agent_loop import AgentLoop


async def test_a_cancelled_program_may_still_use_the_serving_loop_while_the_loop_closes():
    # A program's cleanup that goes through the gateway (its client closing, say) needs the caller's
    # loop to keep serving while close() waits for the cancellation.
    agents, serving, started, cleaned = AgentLoop(), asyncio.get_running_loop(), threading.Event(), []

    async def program() -> None:
        try:
            started.set()
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            reply = asyncio.run_coroutine_threadsafe(asyncio.sleep(0, "served"), serving)
            cleaned.append(await asyncio.wrap_future(reply))
            raise

    running = asyncio.create_task(agents.run(program()))
    await asyncio.to_thread(started.wait)
    t0 = time.monotonic()
    await agents.close(grace_s=10)
    assert cleaned == ["served"]
    assert time.monotonic() - t0 < 5
    with pytest.raises(asyncio.CancelledError):
        await running


async def test_a_program_that_blocks_its_thread_does_not_hold_close_past_its_grace():
    agents, started = AgentLoop(), threading.Event()

    async def program() -> None:
        started.set()
        time.sleep(1.5)  # blocking code in a coroutine: cancellation cannot reach it

    running = asyncio.create_task(agents.run(program()))
    await asyncio.to_thread(started.wait)
    t0 = time.monotonic()
    await agents.close(grace_s=0.2)
    assert time.monotonic() - t0 < 1.2
    await asyncio.gather(running, return_exceptions=True)
