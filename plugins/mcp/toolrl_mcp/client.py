"""Long-lived MCP client sessions: one per server per event loop, shared by every tool and trajectory.

anyio requires a context to be exited by the task that entered it, so each connection runs in a
background *owner* task that enters the transport and the ``ClientSession``, then waits until it is
told to stop. Calls are made from the callers' own tasks on the shared session: the SDK's dispatcher
correlates concurrent requests, applies per-request timeouts and sends a cancel notification for
requests their caller abandoned, so a timed-out call leaves the session usable.

A broken connection (the server exited, the HTTP endpoint went away) fails the calls in flight and
the calls that follow, never hangs them. The first call after a break reconnects at once; if that
fails, reconnect attempts back off exponentially and calls in between fail fast with the last error.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
import mcp.types as types
import toolrl
from mcp import ClientSession, MCPError, StdioServerParameters, stdio_client
from mcp.types.jsonrpc import CONNECTION_CLOSED, INVALID_REQUEST, REQUEST_TIMEOUT
from toolrl import InfrastructureError

from toolrl_mcp.config import ServerSpec

if sys.version_info < (3, 11):
    from exceptiongroup import BaseExceptionGroup

T = TypeVar("T")
CLIENT_INFO = types.Implementation(name="toolrl", version=toolrl.__version__)


class ServerUnavailable(ConnectionError, InfrastructureError):
    """The server cannot be reached now; the message says why and when the next attempt is. An
    infrastructure failure (toolrl.schemas.InfrastructureError): the trajectory it hits is not trained."""


def describe_error(exc: BaseException) -> str:
    """The innermost useful message of an exception, unwrapping anyio's exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class _EOFWatch:
    """Wraps a transport's read stream to report the server hanging up (a stdio child exiting)
    the moment it happens, rather than at the next call."""

    def __init__(self, stream: Any, on_eof: Callable[[], None]) -> None:
        self._stream = stream
        self._on_eof = on_eof

    def __getattr__(self, name: str) -> Any:  # e.g. `last_context`, read by the dispatcher
        return getattr(self._stream, name)

    async def receive(self) -> Any:
        try:
            return await self._stream.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._on_eof()
            raise

    def __aiter__(self) -> _EOFWatch:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def __aenter__(self) -> _EOFWatch:
        await self._stream.__aenter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        return await self._stream.__aexit__(*exc_info)


@dataclass(eq=False)
class _Generation:
    """One connection attempt and, once it succeeds, the session it serves until stopped."""

    ready: asyncio.Future[ClientSession]
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    error: str | None = None


class MCPConnection:
    """One server's shared session on one event loop, with a cap on calls in flight."""

    def __init__(self, name: str, spec: ServerSpec) -> None:
        self.name = name
        self.spec = spec
        self.loop = asyncio.get_running_loop()
        self.closed = False
        self.sessions_opened = 0
        self._slots = asyncio.Semaphore(spec.max_concurrency)
        self._current: _Generation | None = None
        self._generations: set[_Generation] = set()
        self._failures = 0
        self._retry_at = 0.0
        self._last_error = ""

    # -- requests -----------------------------------------------------------------------------

    async def list_tools(self) -> list[types.Tool]:
        async with self._slots:
            generation, session = await self._session()
            tools: list[types.Tool] = []
            cursor: str | None = None
            while True:
                params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
                page = await self._request(generation, session.list_tools(params=params))
                tools.extend(page.tools)
                cursor = page.next_cursor
                if not cursor:
                    return tools

    async def call_tool(self, name: str, arguments: dict[str, Any], timeout: float) -> types.CallToolResult:
        """Call a tool; raises ``TimeoutError`` after ``timeout`` seconds (the server is told to
        cancel), ``ServerUnavailable`` when the connection is down, ``MCPError`` for protocol errors."""
        deadline = self.loop.time() + timeout
        async with self._slots:
            generation, session = await self._session()
            remaining = deadline - self.loop.time()
            if remaining <= 0:
                raise asyncio.TimeoutError(f"MCP server {self.name!r}: no free slot or session within {timeout:g} s")
            return await self._request(
                generation, session.call_tool(name, arguments, read_timeout_seconds=remaining)
            )

    async def _request(self, generation: _Generation, request: Awaitable[T]) -> T:
        try:
            result = await request
        except MCPError as exc:
            if exc.code == REQUEST_TIMEOUT:
                raise asyncio.TimeoutError(f"MCP server {self.name!r}: {exc.message}") from None
            # "Session terminated": an HTTP server that restarted no longer knows our session.
            if exc.code == CONNECTION_CLOSED or (exc.code == INVALID_REQUEST and "terminated" in exc.message):
                self._fail(generation, exc.message)
                raise ServerUnavailable(f"MCP server {self.name!r}: connection lost ({generation.error})") from None
            raise
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream) as exc:
            self._fail(generation, describe_error(exc))
            raise ServerUnavailable(f"MCP server {self.name!r}: connection lost ({generation.error})") from None
        self._failures = 0
        return result

    # -- the session's lifecycle ----------------------------------------------------------------

    async def _session(self) -> tuple[_Generation, ClientSession]:
        if self.closed:
            raise ServerUnavailable(f"MCP server {self.name!r}: the connection was closed")
        generation = self._current
        if generation is None:
            wait = self._retry_at - self.loop.time()
            if wait > 0:
                raise ServerUnavailable(
                    f"MCP server {self.name!r} is unavailable ({self._last_error}); "
                    f"next reconnect attempt in {wait:.1f} s"
                )
            generation = self._current = self._start()
        try:
            async with asyncio.timeout(self.spec.connect_timeout):
                session = await asyncio.shield(generation.ready)
        except TimeoutError:
            self._fail(generation, f"no session within connect_timeout={self.spec.connect_timeout:g} s")
            raise ServerUnavailable(f"MCP server {self.name!r}: {generation.error}") from None
        return generation, session

    def _start(self) -> _Generation:
        generation = _Generation(ready=self.loop.create_future())
        # Mark a failed attempt's exception as retrieved even when no caller is waiting any more.
        generation.ready.add_done_callback(lambda f: f.cancelled() or f.exception())
        generation.task = self.loop.create_task(self._own(generation), name=f"mcp-session:{self.name}")
        self._generations.add(generation)
        generation.task.add_done_callback(lambda _: self._generations.discard(generation))
        return generation

    async def _own(self, generation: _Generation) -> None:
        """The owner task: enters and exits the transport and session contexts."""
        try:
            async with contextlib.AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(self._transport())
                watched = _EOFWatch(read, lambda: self._fail(generation, "the server closed the connection"))
                session = await stack.enter_async_context(
                    ClientSession(watched, write, read_timeout_seconds=self.spec.connect_timeout,
                                  client_info=CLIENT_INFO)
                )
                await session.initialize()
                self.sessions_opened += 1
                generation.ready.set_result(session)
                await generation.stop.wait()
        except Exception as exc:  # includes anyio's exception groups from transport tasks
            self._fail(generation, describe_error(exc))
        finally:
            if not generation.ready.done():
                reason = generation.error or "connection attempt cancelled"
                generation.ready.set_exception(ServerUnavailable(f"MCP server {self.name!r}: cannot connect ({reason})"))

    @contextlib.asynccontextmanager
    async def _transport(self) -> AsyncIterator[tuple[Any, Any]]:
        spec = self.spec
        if spec.transport == "stdio":
            assert spec.command is not None
            params = StdioServerParameters(command=spec.command, args=spec.args, env=spec.env, cwd=spec.cwd)
            async with stdio_client(params) as streams:
                yield streams
        elif spec.transport == "sse":
            from mcp.client.sse import sse_client

            assert spec.url is not None
            async with sse_client(spec.url, headers=spec.http_headers() or None,
                                  timeout=spec.connect_timeout) as streams:
                yield streams
        else:
            import httpx2
            from mcp.client.streamable_http import streamable_http_client

            assert spec.url is not None
            # No read timeout: a response may take as long as the call's own timeout, enforced above.
            timeout = httpx2.Timeout(spec.connect_timeout, read=None)
            async with (
                httpx2.AsyncClient(headers=spec.http_headers(), timeout=timeout) as http,
                streamable_http_client(spec.url, http_client=http) as streams,
            ):
                yield streams

    def _fail(self, generation: _Generation, error: str) -> None:
        """Retire a generation; the first failure after a working session may retry at once,
        later ones wait ``backoff_initial * 2**k`` (at most ``backoff_max``)."""
        generation.error = generation.error or error
        if self._current is generation:
            self._current = None
            self._failures += 1
            delay = 0.0 if self._failures == 1 else min(
                self.spec.backoff_max, self.spec.backoff_initial * 2 ** (self._failures - 2)
            )
            self._retry_at = self.loop.time() + delay
            self._last_error = generation.error
        generation.stop.set()
        if not generation.ready.done() and generation.task is not asyncio.current_task():
            assert generation.task is not None
            generation.task.cancel()

    # -- shutdown -----------------------------------------------------------------------------------

    def request_close(self) -> None:
        """Stop every session of this connection; connection attempts still under way are cancelled."""
        self.closed = True
        self._current = None
        for generation in self._generations:
            generation.stop.set()
            if not generation.ready.done() and generation.task is not None:
                generation.task.cancel()

    async def aclose(self) -> None:
        """Stop the sessions and wait until they are down (stdio children exited and reaped)."""
        self.request_close()
        tasks = {g.task for g in self._generations if g.task is not None}
        if tasks:
            await asyncio.wait(tasks)


class ConnectionPool:
    """The process's connections, one per (event loop, server): tools built on one loop and called on
    another (``asyncio.run`` twice) get a session on the loop the calls arrive on. Tools lease their
    server; the last lease released closes it."""

    def __init__(self) -> None:
        self._by_loop: dict[asyncio.AbstractEventLoop, dict[str, MCPConnection]] = {}
        self._leases: Counter[str] = Counter()

    def get(self, name: str, spec: ServerSpec) -> MCPConnection:
        loop = asyncio.get_running_loop()
        if loop not in self._by_loop:  # a new loop: forget the connections of loops that are gone
            for closed in [other for other in self._by_loop if other.is_closed()]:
                del self._by_loop[closed]
        connections = self._by_loop.setdefault(loop, {})
        key = spec.connection_key(name)
        connection = connections.get(key)
        if connection is None or connection.closed:
            connection = connections[key] = MCPConnection(name, spec)
        return connection

    def lease(self, key: str) -> None:
        self._leases[key] += 1

    async def release(self, key: str) -> None:
        self._leases[key] -= 1
        if self._leases[key] <= 0:
            del self._leases[key]
            await self.close(key)

    async def close_unleased(self, key: str) -> None:
        if self._leases[key] <= 0:
            self._leases.pop(key, None)
            await self.close(key)

    async def close(self, key: str) -> None:
        current = asyncio.get_running_loop()
        for loop, connections in list(self._by_loop.items()):
            connection = connections.pop(key, None)
            if connection is None:
                continue
            if loop is current:
                await connection.aclose()
            elif not loop.is_closed():
                loop.call_soon_threadsafe(connection.request_close)


POOL = ConnectionPool()
