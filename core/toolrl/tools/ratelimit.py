"""Rate limiting for tool calls: an in-flight cap plus an optional calls-per-second bucket, for one process
(:class:`LocalRateLimiter`: thread-safe, tied to no event loop) or a whole Ray cluster
(:class:`RayRateLimiter`: one named actor, the same name the same limiter on every node).

Admission is FIFO, so bursts cannot starve anyone; rate is paced with GCRA (a token bucket in timestamp
form, ``burst`` calls back to back). A slot is released on every path out of :meth:`RateLimiter.slot`,
also while still queued.

    limiter = make_rate_limiter(max_in_flight=8, calls_per_second=20)
    async with limiter.slot() as admission:
        ...                                   # admission.wait_s: time spent queued
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Admission:
    """One admitted call. ``wait_s`` is the time from asking to starting (queue plus pacing)."""

    ticket: str
    wait_s: float


class _AdmissionCore:
    """FIFO admission bookkeeping without I/O or locking (callers serialise access).

    ``request`` either grants at once or queues; ``release``/``cancel`` free slots and grant queued
    tickets in order. A grant carries the delay the holder must wait before starting (rate pacing).
    """

    def __init__(self, max_in_flight: int | None, calls_per_second: float | None, burst: int | None) -> None:
        if max_in_flight is not None and max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1 (or None for no cap)")
        if calls_per_second is not None and calls_per_second <= 0:
            raise ValueError("calls_per_second must be positive (or None for no rate limit)")
        if burst is not None and burst < 1:
            raise ValueError("burst must be at least 1")
        self.max_in_flight = max_in_flight
        self.calls_per_second = calls_per_second
        self.burst = burst or 1
        self._queue: OrderedDict[str, Callable[[float], None]] = OrderedDict()
        self._granted: dict[str, float] = {}  # ticket -> grant time (monotonic)
        self._tat = 0.0  # GCRA theoretical arrival time
        self.peak_in_flight = 0
        self.admitted = 0

    def _pace(self, now: float) -> float:
        if self.calls_per_second is None:
            return 0.0
        interval = 1.0 / self.calls_per_second
        tat = max(self._tat, now)
        start = max(now, tat - (self.burst - 1) * interval)
        self._tat = tat + interval
        return start - now

    def _dispatch(self) -> None:
        while self._queue and (self.max_in_flight is None or len(self._granted) < self.max_in_flight):
            ticket, on_grant = self._queue.popitem(last=False)
            now = time.monotonic()
            self._granted[ticket] = now
            self.admitted += 1
            self.peak_in_flight = max(self.peak_in_flight, len(self._granted))
            on_grant(self._pace(now))

    def request(self, ticket: str, on_grant: Callable[[float], None]) -> None:
        self._queue[ticket] = on_grant
        self._dispatch()

    def release(self, ticket: str) -> bool:
        """Free a granted ticket, or withdraw a queued one; False when it is neither (idempotent)."""
        if self._granted.pop(ticket, None) is None and self._queue.pop(ticket, None) is None:
            return False
        self._dispatch()
        return True

    def expire(self, older_than: float) -> None:
        """Release grants made before ``older_than`` (monotonic): holders that died never release."""
        self._granted = {t: granted_at for t, granted_at in self._granted.items() if granted_at >= older_than}
        self._dispatch()

    def stats(self) -> dict[str, Any]:
        return {"in_flight": len(self._granted), "queued": len(self._queue),
                "peak_in_flight": self.peak_in_flight, "admitted": self.admitted,
                "max_in_flight": self.max_in_flight, "calls_per_second": self.calls_per_second,
                "burst": self.burst}


class RateLimiter(ABC):
    """The interface tools use: ``async with limiter.slot() as admission: ...``."""

    @abstractmethod
    async def acquire(self) -> Admission:
        """Wait for admission (FIFO). If cancelled or failing while waiting, nothing stays held."""

    @abstractmethod
    def release(self, admission: Admission) -> None:
        """Free the slot. Never blocks and never raises, so it is safe in ``finally`` and on cancel."""

    @abstractmethod
    def stats(self) -> dict[str, Any]:
        """``in_flight``, ``queued``, ``peak_in_flight``, ``admitted`` and the configured limits."""

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[Admission]:
        admission = await self.acquire()
        try:
            yield admission
        finally:
            self.release(admission)


def _set_result(fut: asyncio.Future, value: float) -> None:
    if not fut.done():
        fut.set_result(value)


class LocalRateLimiter(RateLimiter):
    """Limits calls in this process across threads and event loops."""

    def __init__(self, max_in_flight: int | None = None, calls_per_second: float | None = None,
                 burst: int | None = None) -> None:
        self._core = _AdmissionCore(max_in_flight, calls_per_second, burst)
        self._lock = threading.Lock()

    async def acquire(self) -> Admission:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[float] = loop.create_future()
        ticket = uuid.uuid4().hex
        start = time.monotonic()
        inside_request = True

        def on_grant(delay: float) -> None:
            # Called under the lock: at once from our own request(), or later from another caller's
            # release(), possibly on another thread, so the grant goes through the waiter's loop.
            if inside_request:
                fut.set_result(delay)
            else:
                loop.call_soon_threadsafe(_set_result, fut, delay)

        with self._lock:
            self._core.request(ticket, on_grant)
            inside_request = False
        try:
            delay = fut.result() if fut.done() else await fut
            if delay > 0:
                await asyncio.sleep(delay)
        except BaseException:
            # Cancelled or failed while queued or pacing: withdraw the ticket or free its slot.
            with self._lock:
                self._core.release(ticket)
            raise
        return Admission(ticket, time.monotonic() - start)

    def release(self, admission: Admission) -> None:
        with self._lock:
            self._core.release(admission.ticket)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return self._core.stats()


class _LimiterActor:
    """The cluster-wide admission state, run as an async Ray actor (one event loop, no locks)."""

    def __init__(self, max_in_flight: int | None, calls_per_second: float | None, burst: int | None,
                 lease_timeout_s: float | None) -> None:
        self._core = _AdmissionCore(max_in_flight, calls_per_second, burst)
        self._lease_timeout_s = lease_timeout_s
        # Releases that found no ticket (arrived before their acquire, or after a lease expired).
        self._withdrawn: OrderedDict[str, None] = OrderedDict()
        self._reaper: asyncio.Task | None = None

    async def acquire(self, ticket: str) -> float:
        if self._withdrawn.pop(ticket, False) is None:
            return 0.0  # its holder already gave up
        if self._lease_timeout_s is not None and self._reaper is None:
            self._reaper = asyncio.get_running_loop().create_task(self._reap())
        fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._core.request(ticket, lambda delay: _set_result(fut, delay))
        return await fut

    def release(self, ticket: str) -> None:
        if not self._core.release(ticket):
            self._withdrawn[ticket] = None
            if len(self._withdrawn) > 100_000:
                self._withdrawn.popitem(last=False)

    def stats(self) -> dict[str, Any]:
        return self._core.stats()

    async def _reap(self) -> None:
        assert self._lease_timeout_s is not None
        while True:
            await asyncio.sleep(min(self._lease_timeout_s / 4, 5.0))
            self._core.expire(time.monotonic() - self._lease_timeout_s)


class RayRateLimiter(RateLimiter):
    """A limiter shared by every process of a Ray cluster: the named actor ``toolrl-ratelimit:NAME``.

    The first process to ask creates it with these limits; later ones get the same actor (and its
    limits). Like any non-detached actor it lives while its creator does; if that process exits, the
    next call here creates it again (counts restart from zero). ``lease_timeout_s`` reclaims slots of
    holders that died without releasing. Needs a connected Ray (``ray.init`` done, or running inside
    a Ray worker).
    """

    def __init__(self, name: str, max_in_flight: int | None = None, calls_per_second: float | None = None,
                 burst: int | None = None, lease_timeout_s: float | None = None,
                 namespace: str | None = None) -> None:
        import ray

        if not ray.is_initialized():
            raise RuntimeError("RayRateLimiter needs a connected Ray: call ray.init() first")
        self.name = f"toolrl-ratelimit:{name}"
        self._options = {
            "name": self.name, "namespace": namespace, "get_if_exists": True, "num_cpus": 0,
            "max_concurrency": 100_000,  # every queued acquire is a pending coroutine in the actor
        }
        self._args = (max_in_flight, calls_per_second, burst, lease_timeout_s)
        self._actor = self._connect()

    def _connect(self) -> Any:
        import ray

        return ray.remote(_LimiterActor).options(**self._options).remote(*self._args)

    async def acquire(self) -> Admission:
        from ray.exceptions import RayActorError

        ticket = uuid.uuid4().hex
        start = time.monotonic()
        attempts = 5
        for attempt in range(1, attempts + 1):
            actor = self._actor
            try:
                delay = await actor.acquire.remote(ticket)
                if delay > 0:
                    await asyncio.sleep(delay)
                break
            except RayActorError:
                if attempt == attempts:
                    raise
                # Its creator exited or it was killed: find or create it again. Right after a kill the
                # dead actor's name can still resolve for a moment, so back off between tries.
                await asyncio.sleep(0.1 * attempt)
                self._actor = self._connect()
            except BaseException:
                actor.release.remote(ticket)  # queued, granted or not yet arrived: the actor sorts it out
                raise
        return Admission(ticket, time.monotonic() - start)

    def release(self, admission: Admission) -> None:
        # Fire and forget: submission is synchronous, so this cannot be lost to a cancellation.
        self._actor.release.remote(admission.ticket)

    def stats(self) -> dict[str, Any]:
        import ray

        return ray.get(self._actor.stats.remote())


def make_rate_limiter(max_in_flight: int | None = None, calls_per_second: float | None = None, *,
                      burst: int | None = None, global_name: str | None = None,
                      lease_timeout_s: float | None = None) -> RateLimiter:
    """A cluster-wide limiter when ``global_name`` is given, else one for this process."""
    if global_name is not None:
        return RayRateLimiter(global_name, max_in_flight, calls_per_second, burst, lease_timeout_s)
    return LocalRateLimiter(max_in_flight, calls_per_second, burst)
