"""The event loop agent programs run on: a thread of its own, apart from the loop that serves the gateway and
drives the engine.

An in-process program (a ``callable`` agent, a plugin's) spends CPU of its own on every call: its client
builds the request, its HTTP stack sends it, it parses the reply (3–4 ms a call for the ``openai`` client).
On the serving loop, 256 episodes starting together build and send their 256 requests one after another
before the server reads the first, and the engine's scheduler waits behind them all. On a loop of their
own, the server takes each request as it arrives and the engine starts on the first ones while the
programs still send the rest (the engine's steps are torch work, which releases the GIL).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class AgentLoop:
    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    async def run(self, program: Coroutine[Any, Any, T]) -> T:
        """``program`` run to its end on the agents' loop. Cancelling the caller cancels the program
        there (its deadline, the run's end)."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever, name="toolrl-agents", daemon=True)
            self._thread.start()
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(program, self._loop))

    async def close(self, grace_s: float = 30.0) -> None:
        """Cancel what still runs there and end the thread, waiting at most ``grace_s`` for each. Awaited,
        not blocking: a program's cancellation may still need the gateway it calls, served on the caller's
        loop. A program that ignores its cancellation, or blocks its thread, is left to that (daemon)
        thread, and its loop is not closed under it."""
        loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is None or thread is None:
            return
        cancelled = asyncio.wrap_future(asyncio.run_coroutine_threadsafe(_cancel_all(), loop))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace_s):
                await cancelled
        loop.call_soon_threadsafe(loop.stop)
        await asyncio.to_thread(thread.join, grace_s)
        if not thread.is_alive():
            loop.close()


async def _cancel_all() -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
