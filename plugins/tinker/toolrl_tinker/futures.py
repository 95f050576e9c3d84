"""The futures protocol: every training and sampling call answers a request id at once and its result
later, which the client long-polls (``retrieve_future``); one training client's requests run in the
order of their ``seq_id``.

A future's result is a response body and its content type (protobuf where the SDK asks for it), or an
error in the shape the SDK raises as ``RequestFailedError`` (``{"error", "category"}``).
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from toolrl_tinker.store import Store

# How long one retrieve_future waits before answering "try again" (the SDK reads for 45 s; each answer
# is a warning line in its log).
LONG_POLL_S = 40.0
# A seq_id gap (a request the client never sent) is skipped after this long.
GAP_S = 30.0
# A finished future's result is kept this long after it was first retrieved (the SDK may ask again).
KEEP_S = 120.0


@dataclass
class Future:
    owner: str
    done: asyncio.Event = field(default_factory=asyncio.Event)
    body: bytes = b""
    content_type: str = "application/json"
    error: str | None = None
    category: str = "user"
    retrieved: bool = False


class Futures:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._futures: dict[str, Future] = {}
        self._ids = itertools.count()

    def new(self, owner: str) -> tuple[str, Future]:
        request_id = f"req-{uuid.uuid4().hex[:12]}-{next(self._ids)}"
        fut = Future(owner)
        self._futures[request_id] = fut
        self.store.future_started(request_id, owner)
        return request_id, fut

    def finish(self, request_id: str, body: bytes, content_type: str) -> None:
        fut = self._futures[request_id]
        fut.body, fut.content_type = body, content_type
        fut.done.set()
        self.store.future_ended(request_id)

    def fail(self, request_id: str, error: str, category: str = "user") -> None:
        fut = self._futures[request_id]
        fut.error, fut.category = error, category
        fut.done.set()
        self.store.future_ended(request_id)

    async def wait(self, request_id: str, owner: str) -> Future | None:
        """The finished future, None when it is still running after the long poll; KeyError for an id
        this owner does not have."""
        fut = self._futures.get(request_id)
        if fut is None or fut.owner != owner:
            lost = self.store.lost_future(request_id)
            if lost is not None and lost[0] == owner:
                return Future(owner, error=lost[1], category="server")
            raise KeyError(request_id)
        try:
            async with asyncio.timeout(LONG_POLL_S):
                await fut.done.wait()
        except TimeoutError:
            return None
        if not fut.retrieved:
            fut.retrieved = True
            asyncio.get_running_loop().call_later(KEEP_S, self.forget, request_id)
        return fut

    def forget(self, request_id: str) -> None:
        self._futures.pop(request_id, None)


class InOrder:
    """One training client's requests, run one at a time in ``seq_id`` order from ``first``."""

    def __init__(self, first: int = 1) -> None:
        self.next = first
        self._waiting: dict[int, tuple[float, Callable[[], Awaitable[None]]]] = {}
        self._lock = asyncio.Lock()

    async def submit(self, seq_id: int | None, job: Callable[[], Awaitable[None]]) -> None:
        """Queue ``job`` (seq_id None: after those queued) and run every job whose turn has come."""
        if seq_id is None or seq_id < self.next or seq_id in self._waiting:
            seq_id = max([self.next - 1, *self._waiting]) + 1
        self._waiting[seq_id] = (time.monotonic(), job)
        asyncio.get_running_loop().call_later(GAP_S + 0.1, lambda: asyncio.ensure_future(self._drain()))
        await self._drain()

    async def closed(self) -> None:
        """Once the jobs under way have run (those queued behind a gap are dropped)."""
        async with self._lock:
            self._waiting.clear()

    async def _drain(self) -> None:
        async with self._lock:
            while self._waiting:
                if self.next not in self._waiting:
                    oldest = min(t for t, _ in self._waiting.values())
                    if time.monotonic() - oldest < GAP_S:
                        return
                    self.next = min(self._waiting)  # the gap's request never came
                _, job = self._waiting.pop(self.next)
                self.next += 1
                await job()
