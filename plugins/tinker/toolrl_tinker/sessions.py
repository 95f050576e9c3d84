"""Client sessions: one per ``ServiceClient``, kept alive by its heartbeat (the SDK sends one every 10 s)
and ended by the client (``ServiceClient.close()``) or, for a client that died or lost the network, by
``timeout`` seconds without a heartbeat. Ending a session frees what its training clients hold in
memory (``on_end``); what they saved stays on disk. A heartbeat for a session the server does not hold
(ended, timed out, or from before a restart) is answered 410, which stops the SDK's heartbeat loop."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable

from toolrl_tinker.requests import UserError


class SessionGone(Exception):
    """A heartbeat for a session the server does not hold: HTTP 410."""


class Sessions:
    def __init__(self, timeout: float, on_end: Callable[[str, str], Awaitable[None]]) -> None:
        self.timeout = timeout
        self.on_end = on_end  # (session id, reason: closed or timed_out)
        self.owners: dict[str, str] = {}  # session id -> owner
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def create(self, owner: str) -> str:
        session_id = f"s{uuid.uuid4().hex[:12]}"
        self.owners[session_id] = owner
        self._arm(session_id)
        return session_id

    def check(self, owner: str, session_id: str) -> None:
        """Raise :class:`UserError` unless ``owner`` holds session ``session_id``."""
        if self.owners.get(session_id) != owner:
            raise UserError(f"unknown session {session_id!r}: it ended (closed, {self.timeout:g} s without a "
                            "heartbeat, or a server restart); make a new ServiceClient")

    def heartbeat(self, owner: str, session_id: str) -> None:
        if self.owners.get(session_id) != owner:
            raise SessionGone(f"session {session_id!r} has ended")
        self._arm(session_id)

    async def end(self, session_id: str, reason: str = "closed") -> None:
        """Session ``session_id`` over: its timer stopped, then ``on_end``."""
        if self.owners.pop(session_id, None) is None:
            return
        if (timer := self._timers.pop(session_id, None)) is not None:
            timer.cancel()
        await self.on_end(session_id, reason)

    def _arm(self, session_id: str) -> None:
        if (timer := self._timers.get(session_id)) is not None:
            timer.cancel()
        self._timers[session_id] = asyncio.get_running_loop().call_later(
            self.timeout, lambda: asyncio.ensure_future(self.end(session_id, "timed_out")))
