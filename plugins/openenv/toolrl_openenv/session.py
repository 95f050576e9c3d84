"""OpenEnv sessions, one per trajectory, shared by that trajectory's tools.

A session is one WebSocket to the server (the server keeps one environment instance per
connection): ``reset`` when the trajectory's first tool is created, ``step`` per tool call, closed
when its last tool is released. Every round trip has a deadline, so a server that hangs or dies
gives an error, never a stalled rollout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

from openenv.core.generic_client import GenericEnvClient
from toolrl.tools import SharedResources


class SessionError(RuntimeError):
    """The server failed a round trip (gone, timed out, or answered an error)."""


def describe(exc: BaseException) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        return "timed out"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


@dataclass
class Step:
    """What one reset/step observed."""

    observation: dict[str, Any]
    reward: float | None
    done: bool


@dataclass
class Session:
    client: GenericEnvClient
    timeout_s: float
    reset_kwargs: dict[str, Any]
    last: Step | None = None
    broken: str | None = None  # why the session failed; the trajectory's reward is then an error
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one message in flight per WebSocket

    async def send(self, kind: str, action: dict[str, Any] | None = None, **kwargs: Any) -> Step:
        if self.broken is not None:
            raise SessionError(f"the OpenEnv session failed earlier ({self.broken})")
        async with self.lock:
            try:
                call = self.client.reset(**kwargs) if kind == "reset" else self.client.step(action)
                result = await asyncio.wait_for(call, self.timeout_s)
            except Exception as exc:
                self.broken = f"{kind}: {describe(exc)}"
                raise SessionError(f"OpenEnv {kind} failed: {describe(exc)}") from None
        step = Step(dict(result.observation or {}), _reward(result.reward), bool(result.done))
        self.last = step
        return step

    async def close(self) -> None:
        with contextlib.suppress(Exception):  # a dead server's socket: nothing left to close
            await asyncio.wait_for(self.client.close(), self.timeout_s)


def _reward(value: Any) -> float | None:
    return None if value is None else float(value)


class Sessions:
    """The open sessions of one server, by trajectory; at most ``max_sessions`` at once."""

    def __init__(self, base_url: str, connect_timeout_s: float, message_timeout_s: float,
                 max_sessions: int | None) -> None:
        self.base_url = base_url
        self.connect_timeout_s, self.message_timeout_s = connect_timeout_s, message_timeout_s
        self.slots = asyncio.Semaphore(max_sessions) if max_sessions else None
        self.open: SharedResources[Session] = SharedResources(close=self._close, what="OpenEnv session")

    def client(self) -> GenericEnvClient:
        return GenericEnvClient(base_url=self.base_url, connect_timeout_s=self.connect_timeout_s,
                                message_timeout_s=self.message_timeout_s)

    async def acquire(self, key: str, holder: str, reset_kwargs: dict[str, Any]) -> Session:
        """The trajectory ``key``'s session, now held by ``holder``, reset with ``reset_kwargs`` by its
        first tool; the others give the same kwargs or none."""
        session = await self.open.acquire(key, holder, lambda: self._start(reset_kwargs))
        if reset_kwargs and session.reset_kwargs != reset_kwargs:
            await self.open.release(key, holder)
            raise ValueError(f"create_kwargs {json.dumps(reset_kwargs, default=str)} differ from those another "
                             f"tool of this trajectory reset the session with "
                             f"({json.dumps(session.reset_kwargs, default=str)})")
        return session

    async def _start(self, reset_kwargs: dict[str, Any]) -> Session:
        if self.slots is not None:
            await self.slots.acquire()
        session = Session(self.client(), self.message_timeout_s + self.connect_timeout_s, dict(reset_kwargs))
        try:
            await session.send("reset", **reset_kwargs)
        except BaseException:
            await self._close(session)
            raise
        return session

    async def release(self, key: str, holder: str) -> None:
        await self.open.release(key, holder)

    async def _close(self, session: Session) -> None:
        try:
            await session.close()
        finally:
            if self.slots is not None:
                self.slots.release()

    async def list_tools(self) -> tuple[list[dict[str, Any]] | None, dict[str, Any]]:
        """The tools a fresh session offers after reset (None: not an MCP environment), and the
        server's ``/schema`` (the action model of other environments)."""
        import httpx

        async with httpx.AsyncClient(timeout=self.message_timeout_s) as http:
            response = await http.get(f"{self.base_url}/schema")
            response.raise_for_status()
            schema = response.json()
        if not is_mcp(schema):
            return None, schema
        session = Session(self.client(), self.message_timeout_s + self.connect_timeout_s, {})
        try:
            await session.send("reset")
            listed = await session.send("step", {"type": "list_tools"})
        finally:
            await session.close()
        return list(listed.observation.get("tools") or []), schema


def is_mcp(schema: dict[str, Any]) -> bool:
    """An MCP tool environment takes ``CallToolAction`` (``type: call_tool``) as its action."""
    props = (schema.get("action") or {}).get("properties") or {}
    return (props.get("type") or {}).get("const") == "call_tool" and "tool_name" in props
