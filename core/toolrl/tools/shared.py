"""One resource per trajectory shared by that trajectory's tools (an environment instance, a session).

The first tool's ``create`` starts the resource; the trajectory's other tools, created concurrently by
:class:`toolrl.tools.ToolSet`, wait for that same creation; each holds it until its ``release``, and
the last release closes it. ``ToolSet`` releases only the instances whose ``create`` succeeded, and
cancels a ``create`` that overruns its deadline, so :meth:`SharedResources.acquire` holds nothing
when it raises or is cancelled: a trajectory that ends in an error leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

R = TypeVar("R")
log = logging.getLogger("toolrl.tools")


@dataclass
class _Entry(Generic[R]):
    task: asyncio.Future[R]  # the creation; its result is the resource
    holders: set[str] = field(default_factory=set)


class SharedResources(Generic[R]):
    """Resources by key (a trajectory, :func:`toolrl.tools.trajectory_of`), each created once and
    reference-counted by holder (a tool's instance id, so a repeated acquire or release by the same
    holder counts once). ``close`` frees a resource once its last holder has released it, or once
    its creation finishes when every waiting holder was cancelled meanwhile. ``what`` names the
    resource in errors."""

    def __init__(self, close: Callable[[R], Awaitable[None]] | None = None, what: str = "shared resource") -> None:
        self._close, self.what = close, what
        self._entries: dict[str, _Entry[R]] = {}
        # abandoned creations' closers (kept referenced) -> the creations they wait for
        self._reaping: dict[asyncio.Task[None], asyncio.Future[R]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    async def acquire(self, key: str, holder: str, create: Callable[[], Awaitable[R]]) -> R:
        """``key``'s resource, now held by ``holder``. The first acquire calls ``create()`` (an
        exception it raises at once reaches only this caller); later ones, also while it runs, wait for
        the same creation. A failed creation raises in every waiting holder and is not kept: the next
        acquire creates afresh."""
        entry = self._entries.get(key)
        if entry is None or _failed(entry.task):  # a failed one's waiters may not have woken up yet
            entry = self._entries[key] = _Entry(asyncio.ensure_future(create()))
        entry.holders.add(holder)
        try:
            return await asyncio.shield(entry.task)
        except BaseException:  # the creation failed, or this holder was cancelled while waiting
            entry.holders.discard(holder)
            if not entry.holders and self._entries.get(key) is entry:
                self._abandon(key, entry, cancel=False)
            raise

    def get(self, key: str) -> R:
        """``key``'s created resource; KeyError when there is none (yet)."""
        entry = self._entries.get(key)
        if entry is None or not entry.task.done() or _failed(entry.task):
            raise KeyError(f"no {self.what} for trajectory {key!r}: create() first")
        return entry.task.result()

    async def release(self, key: str, holder: str) -> None:
        """``holder`` lets go of ``key``'s resource; the last holder closes it. The resource is
        forgotten before ``close`` runs, so a ``close`` that raises (the error reaches this caller)
        still leaves nothing registered."""
        entry = self._entries.get(key)
        if entry is None or holder not in entry.holders:
            return
        entry.holders.discard(holder)
        if entry.holders:
            return
        if not entry.task.done():
            self._abandon(key, entry, cancel=False)
            return
        del self._entries[key]
        await self._close_done(entry.task)

    async def close_all(self) -> None:
        """Forget every resource and close those that were created; creations still running (also
        abandoned ones) are cancelled. A failing close is logged."""
        for key, entry in list(self._entries.items()):
            entry.holders.clear()
            if not entry.task.done():
                self._abandon(key, entry, cancel=True)
                continue
            del self._entries[key]
            try:
                await self._close_done(entry.task)
            except Exception:
                log.exception("closing the shared resource of %r failed", key)
        for creation in self._reaping.values():
            creation.cancel()
        if self._reaping:
            await asyncio.gather(*self._reaping)

    def _abandon(self, key: str, entry: _Entry[R], cancel: bool) -> None:
        """Nobody waits for ``key``'s creation any more: forget it and close what it makes. It is let
        finish (cancelling a creation in a thread would lose what the thread makes), except at
        :meth:`close_all`."""
        del self._entries[key]
        if cancel:
            entry.task.cancel()
        reaper = asyncio.ensure_future(self._close_when_done(key, entry.task))
        self._reaping[reaper] = entry.task
        reaper.add_done_callback(lambda done: self._reaping.pop(done, None))

    async def _close_when_done(self, key: str, task: asyncio.Future[R]) -> None:
        await asyncio.wait({task})
        try:
            await self._close_done(task)
        except Exception:
            log.exception("closing the abandoned shared resource of %r failed", key)

    async def _close_done(self, task: asyncio.Future[R]) -> None:
        if self._close is not None and not _failed(task):
            await self._close(task.result())


def _failed(task: asyncio.Future[R]) -> bool:
    return task.done() and (task.cancelled() or task.exception() is not None)
