"""An asyncio event loop on a daemon thread, owned by one engine.

vLLM's ``AsyncLLM`` binds its output handler to the loop it first runs on, while toolrl calls an
engine from whatever loop the caller has (one ``asyncio.run`` per rollout phase, a Ray actor's loop)
and calls ``update_weights`` synchronously from inside a running loop. Giving the engine its own loop
makes both work: coroutines are submitted here and awaited (or waited on) from the caller's side.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule ``coro`` on this loop; cancelling the returned future cancels the coroutine."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` (run on this loop) from another event loop."""
        return await asyncio.wrap_future(self.submit(coro))

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on this loop and block the calling thread until it is done."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("LoopThread.call from its own thread would deadlock")
        return self.submit(coro).result(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float = 30.0) -> None:
        if not self._thread.is_alive():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self.loop.close()
