"""Which checkpoints stay on disk: each run's latest ``keep`` of each kind (``--keep-checkpoints``; 0
keeps them all), and none past its expiry: the TTL its save asked for (``ttl_seconds``), else the server's
default (``--checkpoint-ttl``; none: never), which the rest client's ``set_checkpoint_ttl_from_tinker_path``
sets or clears later. A timer deletes them at the earliest expiry (and the start, those that expired while the
server was down).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from toolrl_tinker.metrics import Metrics
from toolrl_tinker.requests import UserError
from toolrl_tinker.store import Store

# The TTLs a client may ask for, as the hosted service takes them: an hour to ten years.
MIN_TTL_S = 3600
MAX_TTL_S = 10 * 365 * 24 * 3600


class Retention:
    def __init__(self, store: Store, metrics: Metrics, keep: int = 0, ttl: float | None = None) -> None:
        self.store = store
        self.metrics = metrics
        self.keep = keep
        self.ttl = ttl
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Expiry on ``loop`` from now on: what expired already is deleted."""
        self._loop = loop
        self.sweep()

    def expiry(self, ttl_seconds: int | None) -> float | None:
        """When a checkpoint saved now with ``ttl_seconds`` (None: the server's default) expires."""
        if ttl_seconds is None:
            return None if self.ttl is None else time.time() + self.ttl
        return time.time() + _checked(ttl_seconds)

    def add(self, path: str, owner: str, model_id: str, kind: str, name: str, file: Path,
            expires: float | None) -> None:
        """Checkpoint ``path`` recorded; its run's older ones of its kind past the latest ``keep`` deleted."""
        self.store.add_checkpoint(path, owner, model_id, kind, name, file, expires)
        if self.keep:
            for old in self.store.older_than_latest(model_id, kind, self.keep):
                self.delete(old, "keep_latest")
        if expires is not None:
            self._rearm()

    def set_ttl(self, path: str, ttl_seconds: int | None) -> None:
        """The rest client's TTL call: checkpoint ``path`` expires ``ttl_seconds`` from now (None: never)."""
        self.store.set_expiry(path, None if ttl_seconds is None else time.time() + _checked(ttl_seconds))
        self._rearm()

    def delete(self, path: str, reason: str) -> None:
        self.store.delete_checkpoint(path)
        self.metrics.count("tinker_checkpoints_deleted_total", reason=reason)

    def sweep(self, now: float | None = None) -> None:
        """Delete every checkpoint expired by ``now`` (default: now), then wait for the next expiry."""
        for path in self.store.expired(time.time() if now is None else now):
            self.delete(path, "ttl")
        self._arm()

    def _rearm(self) -> None:
        """The timer set again for the earliest expiry (from any thread: saves run in worker threads)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._arm)

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        at = self.store.next_expiry()
        if at is not None and self._loop is not None:
            self._timer = self._loop.call_later(max(0.0, at - time.time()), self.sweep)


def _checked(ttl_seconds: int) -> int:
    if not MIN_TTL_S <= ttl_seconds <= MAX_TTL_S:
        raise UserError(f"ttl_seconds {ttl_seconds}: a checkpoint's TTL is {MIN_TTL_S} s (an hour) to "
                        f"{MAX_TTL_S} s (ten years), or none")
    return ttl_seconds
