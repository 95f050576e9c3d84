"""When vLLM generates, as the engine's loop sees it: requests, weight loads and sleep take turns here.

A request waits for a load in progress (and, after one that failed, for the next) and wakes vLLM if it
sleeps; a load pauses generation between two engine steps and resumes it; sleep drops the prefix cache
or puts vLLM to sleep. One lock orders them; it and the event bind to the engine's loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any


class GenerationGate:
    """Created on the engine's loop, around vLLM's ``AsyncLLM`` (``llm``)."""

    def __init__(self, llm: Any, sleep_level: int) -> None:
        self.llm, self.sleep_level = llm, sleep_level
        self.asleep = False
        self._lock = asyncio.Lock()
        self._whole = asyncio.Event()  # clear while a failed load left the weights half loaded
        self._whole.set()

    async def admit(self) -> None:
        """Before a request: vLLM awake (once a load in progress is done), its weights whole (after a
        failed load: once the next one lands)."""
        async with self._lock:
            if self.asleep:
                await self.llm.wake_up()
                self.asleep = False
        await self._whole.wait()

    @contextlib.asynccontextmanager
    async def pause(self, resume_on_failure: bool = True) -> AsyncIterator[None]:
        """Held for a weight load: generation paused between two engine steps, the requests in flight
        kept (their KV dropped, recomputed on the new weights), and resumed after. A load that fails
        leaves generation paused unless ``resume_on_failure`` (weights half loaded must not sample:
        the next load resumes)."""
        async with self._lock:
            if self.asleep:
                await self.llm.wake_up(tags=["weights"])  # the KV cache stays asleep until the next request
            else:
                await self.llm.pause_generation(mode="keep", clear_cache=True)
            landed = False
            try:
                yield
                landed = True
            finally:
                if landed or resume_on_failure:
                    self._whole.set()
                    if not self.asleep:
                        await self.llm.resume_generation()
                else:
                    self._whole.clear()

    async def sleep(self) -> None:
        """Sleep level 0 (or asleep already): the prefix cache dropped; else vLLM asleep at that level."""
        async with self._lock:
            if self.sleep_level == 0 or self.asleep:
                await self.llm.reset_prefix_cache()
                return
            await self.llm.sleep(level=self.sleep_level, mode="wait")
            self.asleep = True
