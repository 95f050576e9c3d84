"""One OpenEnv episode over the wire, and the server's session slots.

An episode is one WebSocket to the server (the server keeps one environment instance per
connection): ``reset``, then ``step`` per call, closed at the end. Every round trip has a deadline,
so a server that hangs or dies gives an error, never a stalled rollout.

A server holds at most ``max_concurrent_envs`` sessions (OpenEnv's default: one) and refuses the
next with ``CAPACITY_REACHED``, naming its capacity (``Server at capacity: 1/1 sessions active``).
:class:`Slots` queues the run's episodes within that capacity: the configured ``max_sessions``, else
what the server's first refusal says; a refused episode waits for a slot and retries.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import re
import time
from dataclasses import dataclass, field
from typing import Any

from openenv.core.generic_client import GenericEnvClient
from toolrl import InfrastructureError

CAPACITY = re.compile(r"(\d+)\s*/\s*(\d+) sessions active")
RETRY_S = 0.5  # a refusal while the run holds fewer sessions than the capacity: another client holds some
# Whether the WebSocket a connect opens in this context offers permessage-deflate (see _offer_deflate).
_DEFLATE: contextvars.ContextVar[bool] = contextvars.ContextVar("toolrl_openenv_ws_deflate", default=True)


def _offer_deflate() -> None:
    """Let an episode open its WebSocket without permessage-deflate. OpenEnv's client connects with
    websockets' default, compression on: zlib state for both directions, about 60 KiB per open session
    (measured: 71 KiB per session held at 1024 sessions, 8 without), for JSON observations that mostly
    cross a loopback or LAN link. Its connect takes no compression argument, so the connect function
    its module calls is wrapped, once per process: a connect made while :data:`_DEFLATE` is False (an
    episode of a session with ``ws_compression: false``) offers no compression; every other connect,
    this plugin's with compression on or anyone else's, is passed through unchanged."""
    from openenv.core import env_client

    original = env_client.ws_connect
    if getattr(original, "toolrl_deflate_switch", False):
        return

    def connect(*args: Any, **kwargs: Any) -> Any:
        if not _DEFLATE.get():
            kwargs.setdefault("compression", None)
        return original(*args, **kwargs)

    connect.toolrl_deflate_switch = True  # type: ignore[attr-defined]
    env_client.ws_connect = connect


class EpisodeError(InfrastructureError):
    """The server failed a round trip (gone, timed out, or answered an error): the environment's
    failure, not the model's (the model's mistakes come back as observations), so the trajectory ends
    with ``infra_error`` and is not trained."""


class CapacityReached(EpisodeError):
    """The server refused a new session: it holds ``capacity`` already."""

    def __init__(self, message: str, capacity: int | None) -> None:
        super().__init__(message)
        self.capacity = capacity


def describe(exc: BaseException) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        return "timed out"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


@dataclass
class Observed:
    """What one reset/step observed; ``reward`` None: the observation carries none."""

    observation: dict[str, Any]
    reward: float | None
    done: bool


@dataclass
class Episode:
    client: GenericEnvClient
    timeout_s: float
    last: Observed | None = None
    broken: str | None = None  # why the episode failed; the trajectory's score is then an error
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one message in flight per WebSocket
    compression: bool = True  # offer permessage-deflate when the first message opens the WebSocket

    async def send(self, kind: str, action: dict[str, Any] | None = None, **kwargs: Any) -> Observed:
        if self.broken is not None:
            raise EpisodeError(f"the OpenEnv session failed earlier ({self.broken})")
        async with self.lock:
            deflate = _DEFLATE.set(self.compression)
            try:
                call = self.client.reset(**kwargs) if kind == "reset" else self.client.step(action)
                async with asyncio.timeout(self.timeout_s):  # not wait_for: on 3.11 it can drop a cancellation
                    result = await call
            except Exception as exc:
                if "CAPACITY_REACHED" in str(exc):
                    found = CAPACITY.search(str(exc))
                    raise CapacityReached(str(exc), int(found.group(2)) if found else None) from None
                self.broken = f"{kind}: {describe(exc)}"
                raise EpisodeError(f"OpenEnv {kind} failed: {describe(exc)}") from None
            finally:
                _DEFLATE.reset(deflate)
        observed = Observed(dict(result.observation or {}), None if result.reward is None else float(result.reward),
                            bool(result.done))
        self.last = observed
        return observed

    async def close(self) -> None:
        with contextlib.suppress(Exception):  # a dead server's socket: nothing left to close
            async with asyncio.timeout(self.timeout_s):
                await self.client.close()


class Slots:
    """The server's sessions this run may hold: ``limit`` (None: not known yet) and those held."""

    def __init__(self, limit: int | None) -> None:
        self.limit, self.held = limit, 0
        self.changed = asyncio.Condition()

    async def acquire(self, deadline: float) -> None:
        async with self.changed:
            async with asyncio.timeout(max(deadline - time.monotonic(), 0.0)):
                await self.changed.wait_for(lambda: self.limit is None or self.held < self.limit)
            self.held += 1

    async def release(self) -> None:
        async with self.changed:
            self.held -= 1
            self.changed.notify_all()

    async def refused(self, capacity: int | None) -> None:
        """The server refused the session this holder's slot was for: release it, learn the capacity,
        and pause when the run held fewer than that (another client holds the rest)."""
        async with self.changed:
            self.held -= 1
            if self.limit is None:
                self.limit = capacity or max(self.held, 1)
            busy_elsewhere = self.held < self.limit
            self.changed.notify_all()
        if busy_elsewhere:
            await asyncio.sleep(RETRY_S)


async def open_episode(base_url: str, connect_timeout_s: float, message_timeout_s: float, slots: Slots,
                       queue_timeout_s: float, reset_kwargs: dict[str, Any], compression: bool = True) -> Episode:
    """A new episode, reset with ``reset_kwargs``, holding one of ``slots`` (waiting for one, at most
    ``queue_timeout_s``); release the slot when the episode closes. ``compression``: its WebSocket
    offers permessage-deflate."""
    if not compression:
        _offer_deflate()
    deadline = time.monotonic() + queue_timeout_s
    while True:
        try:
            await slots.acquire(deadline)
        except asyncio.TimeoutError:
            raise EpisodeError(f"no OpenEnv session free within {queue_timeout_s:g} s "
                               f"(the server holds {slots.limit}; openenv.queue_timeout_s)") from None
        client = GenericEnvClient(base_url=base_url, connect_timeout_s=connect_timeout_s,
                                  message_timeout_s=message_timeout_s)
        episode = Episode(client, message_timeout_s + connect_timeout_s, compression=compression)
        try:
            await episode.send("reset", **reset_kwargs)
            return episode
        except CapacityReached as exc:
            await episode.close()
            await slots.refused(exc.capacity)
        except BaseException:
            await episode.close()
            await slots.release()
            raise


def is_mcp(schema: dict[str, Any]) -> bool:
    """An MCP tool environment takes ``CallToolAction`` (``type: call_tool``) as its action."""
    props = (schema.get("action") or {}).get("properties") or {}
    return (props.get("type") or {}).get("const") == "call_tool" and "tool_name" in props
