"""The futures protocol: every training and sampling call answers a request id at once and its result
later, which the client long-polls (``retrieve_future``); one training client's requests run in the
order of their ``seq_id``. A result (a body and its content type, or an error the SDK raises as
``RequestFailedError``) is kept :data:`KEEP_S` after it was first retrieved, or :data:`UNCLAIMED_S` after it
ended when nobody retrieves it (its client gone); then its id is unknown (404). Each key's futures not yet
ended, and their tokens, are counted here for the quotas (:mod:`toolrl_tinker.quotas`) and the metrics.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from toolrl_tinker.metrics import Metrics
from toolrl_tinker.store import Store

# How long one retrieve_future waits before answering "try again" (the SDK reads for 45 s; each answer
# is a warning line in its log).
LONG_POLL_S = 40.0
# A seq_id gap (a request the client never sent) is skipped after this long.
GAP_S = 30.0
# A finished future's result is kept this long after it was first retrieved (the SDK may ask again).
KEEP_S = 120.0
# A result nobody retrieved (a client killed, or one that stopped waiting) is kept this long after it ended.
UNCLAIMED_S = 3600.0
# The call a future answers (forward_backward, sample, ...), as the HTTP route that made it names it.
REQUEST_KIND: contextvars.ContextVar[str] = contextvars.ContextVar("tinker_request_kind", default="other")


@dataclass
class Future:
    owner: str
    kind: str = "other"
    tokens: int = 0
    started: float = field(default_factory=time.monotonic)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    body: bytes = b""
    content_type: str = "application/json"
    error: str | None = None
    category: str = "user"
    retrieved: bool = False


class Futures:
    def __init__(self, store: Store, metrics: Metrics) -> None:
        self.store = store
        self.metrics = metrics
        self._futures: dict[str, Future] = {}
        self._ids = itertools.count()
        self.running: Counter[str] = Counter()  # a key's futures not yet ended
        self.tokens: Counter[str] = Counter()  # and their tokens
        self.kinds: Counter[str] = Counter()  # futures not yet ended, by kind

    def new(self, owner: str, tokens: int = 0) -> tuple[str, Future]:
        """A future of ``owner``'s holding ``tokens`` until it ends; its kind is the route's (:data:`REQUEST_KIND`)."""
        request_id = f"req-{uuid.uuid4().hex[:12]}-{next(self._ids)}"
        fut = Future(owner, REQUEST_KIND.get(), tokens)
        self._futures[request_id] = fut
        self.running[owner] += 1
        self.tokens[owner] += tokens
        self.kinds[fut.kind] += 1
        self.store.future_started(request_id, owner)
        return request_id, fut

    def finish(self, request_id: str, body: bytes, content_type: str) -> None:
        fut = self._futures[request_id]
        fut.body, fut.content_type = body, content_type
        self._ended(request_id, fut, "ok")

    def fail(self, request_id: str, error: str, category: str = "user") -> None:
        fut = self._futures[request_id]
        fut.error, fut.category = error, category
        self._ended(request_id, fut, f"{category}_error")

    def _ended(self, request_id: str, fut: Future, outcome: str) -> None:
        fut.done.set()
        self.store.future_ended(request_id)
        for counts, key, n in ((self.running, fut.owner, 1), (self.tokens, fut.owner, fut.tokens), (self.kinds, fut.kind, 1)):
            counts[key] -= n
            if counts[key] <= 0:
                del counts[key]
        self.metrics.count("tinker_requests_total", kind=fut.kind, outcome=outcome, key=fut.owner)
        self.metrics.observe("tinker_request_duration_seconds", time.monotonic() - fut.started, kind=fut.kind)
        asyncio.get_running_loop().call_later(UNCLAIMED_S, self._unclaimed, request_id)

    def _unclaimed(self, request_id: str) -> None:
        fut = self._futures.get(request_id)
        if fut is not None and not fut.retrieved:
            self.forget(request_id)

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
    """One training client's requests, run one at a time in ``seq_id`` order from ``first``; ``on_gap(first,
    last)`` hears of the ``seq_id``s skipped after a :data:`GAP_S` wait (requests the client never sent, or
    the server refused without taking their turn: each a stall of its client's queue)."""

    def __init__(self, first: int = 1, on_gap: Callable[[int, int], None] | None = None) -> None:
        self.next = first
        self.on_gap = on_gap
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
        """Once the job under way has run, and then every job queued (behind a gap or not), in order: a
        closed run's jobs fail at once, each its own future."""
        async with self._lock:
            waiting, self._waiting = self._waiting, {}
            for seq in sorted(waiting):
                await waiting[seq][1]()

    async def _drain(self) -> None:
        async with self._lock:
            while self._waiting:
                if self.next not in self._waiting:
                    oldest = min(t for t, _ in self._waiting.values())
                    if time.monotonic() - oldest < GAP_S:
                        return
                    if self.on_gap is not None:
                        self.on_gap(self.next, min(self._waiting) - 1)
                    self.next = min(self._waiting)  # the gap's request never came
                _, job = self._waiting.pop(self.next)
                self.next += 1
                await job()
