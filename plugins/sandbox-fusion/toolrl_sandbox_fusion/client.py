"""Async client for a SandboxFusion server's ``POST /run_code`` (or ``toolrl sandbox serve``).

Sends the raw JSON body, so ``memory_limit_MB`` reaches the server (the PyPI client's request model
drops it). Retries only what is safe and likely to pass on a second try: connection failures and
HTTP 429/502/503/504, with exponential backoff, full jitter and ``Retry-After`` (a run is idempotent:
each one is a fresh sandbox; a read timeout is never retried, the code may still be running). A
SandboxFusion ``SandboxError`` in a 200 response is a result, not retried: it usually repeats.

At load (thousands of sessions, ``benchmarks/env_load.py``): one bounded keep-alive connection pool per
server per process and event loop, shared by every client of that server (:class:`ServerPool`); a
request enters it only with one of its ``max_connections`` admission slots, so the callers past that
wait in a FIFO semaphore, their own coroutines held back (back-pressure to the rollout loop), never as
requests queued inside the pool. The pool is aiohttp's, not httpx's: httpx's pool rescans every
connection on each request and release (httpcore ``_assign_requests_to_connections``), 2.75 ms of CPU
per request against aiohttp's 0.17 at 1024 sessions on loopback (measured; p99 24 s against 0.3).
Every call has a deadline: the admission wait (``queue_timeout_s``), then the run and compile limits
plus ``timeout_slack_s`` for all its attempts and backoffs.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from pydantic import ValidationError
from toolrl import InfrastructureError

from toolrl_sandbox_fusion.models import RunCodeRequest, RunCodeResponse

RETRY_STATUS = frozenset({429, 502, 503, 504})
# Connection-level failures: the request never reached the server, or the connection broke before
# any answer (a kept-alive connection the server had closed). A read timeout is not retried: the code
# may be running, and would run twice.
RETRY_ERRORS = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError, aiohttp.ServerDisconnectedError,
                aiohttp.ClientOSError)


class SandboxRequestError(InfrastructureError):
    """The server could not be reached or answered with an error after every allowed attempt: the
    infrastructure's failure, not the code's (a trajectory it hits ends with ``infra_error``, untrained)."""

    def __init__(self, message: str, attempts: int) -> None:
        super().__init__(message)
        self.attempts = attempts


def run_code_url(url: str) -> str:
    """Accept a base URL (``http://host:8080``) or the full endpoint (verl configs use ``.../run_code``)."""
    url = url.rstrip("/")
    return url if url.endswith("/run_code") else f"{url}/run_code"


def origin(url: str) -> str:
    """``scheme://host:port``: what one connection pool serves."""
    parsed = urlsplit(url)
    return f"{parsed.scheme}://{parsed.hostname}:{parsed.port or (443 if parsed.scheme == 'https' else 80)}"


class ServerPool:
    """One server's connections in one event loop: a bounded keep-alive pool (an aiohttp session) and
    as many admission slots as it has connections. Shared (reference-counted) by every client of that
    server."""

    def __init__(self, max_connections: int, keepalive_s: float) -> None:
        self.max_connections = max(1, max_connections)
        self.http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=self.max_connections,
                                           keepalive_timeout=keepalive_s),
            trust_env=False,
        )
        self.admission = asyncio.Semaphore(self.max_connections)
        self.users = 0
        self.waiting = 0  # callers waiting for a slot now


# (origin, loop) -> its pool. A client cannot be shared across event loops.
_POOLS: dict[tuple[str, asyncio.AbstractEventLoop], ServerPool] = {}


def pools() -> dict[tuple[str, asyncio.AbstractEventLoop], ServerPool]:
    """The open pools (for tests and the load benchmark)."""
    return {key: pool for key, pool in _POOLS.items() if not key[1].is_closed()}


class SandboxFusionClient:
    """Calls one server through its process-wide :class:`ServerPool` (one per event loop)."""

    def __init__(self, url: str, *, max_attempts: int = 4, backoff_s: float = 0.25, max_backoff_s: float = 8.0,
                 max_connections: int = 32, connect_timeout_s: float = 5.0, timeout_slack_s: float = 10.0,
                 queue_timeout_s: float = 30.0, keepalive_s: float = 30.0) -> None:
        self.url = run_code_url(url)
        self.origin = origin(self.url)
        self.max_attempts = max(1, max_attempts)
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.max_connections = max_connections  # the first client of a server sizes its pool
        self.connect_timeout_s = connect_timeout_s
        self.timeout_slack_s = timeout_slack_s
        self.queue_timeout_s = queue_timeout_s
        self.keepalive_s = keepalive_s
        self._joined: set[asyncio.AbstractEventLoop] = set()

    def _pool(self) -> ServerPool:
        loop = asyncio.get_running_loop()
        for key in [k for k in _POOLS if k[1].is_closed()]:
            del _POOLS[key]
        self._joined = {lp for lp in self._joined if not lp.is_closed()}
        pool = _POOLS.get((self.origin, loop))
        if pool is None:
            pool = _POOLS[(self.origin, loop)] = ServerPool(self.max_connections, self.keepalive_s)
        if loop not in self._joined:
            self._joined.add(loop)
            pool.users += 1
        return pool

    def _delay(self, attempt: int, retry_after: str) -> float:
        if retry_after.replace(".", "", 1).isdigit():
            return min(float(retry_after), self.max_backoff_s)
        return random.uniform(0, min(self.max_backoff_s, self.backoff_s * 2 ** attempt))

    async def run_code(self, request: RunCodeRequest) -> tuple[RunCodeResponse, int]:
        """The server's response and the number of attempts it took."""
        body: dict[str, Any] = request.model_dump(mode="json")
        pool = self._pool()
        loop = asyncio.get_running_loop()
        # verl's budget: the run and compile limits plus slack for queueing on the server; the whole call
        # (every attempt and backoff) within it, after at most queue_timeout_s for an admission slot.
        budget = request.run_timeout + request.compile_timeout + self.timeout_slack_s
        deadline: float | None = None
        problem = ""
        for attempt in range(self.max_attempts):
            retry_after = ""
            queued_until = loop.time() + self.queue_timeout_s
            if deadline is not None:
                queued_until = min(queued_until, deadline)
            limit = queued_until - loop.time()
            pool.waiting += 1
            try:
                async with asyncio.timeout_at(queued_until):
                    await pool.admission.acquire()
            except TimeoutError:
                raise SandboxRequestError(
                    f"{self.url}: no connection free within {max(limit, 0):.3g} s "
                    f"({pool.max_connections} in use, {pool.waiting} waiting)", attempt + 1) from None
            finally:
                pool.waiting -= 1
            if deadline is None:
                deadline = loop.time() + budget
            try:
                left = deadline - loop.time()
                async with asyncio.timeout_at(deadline), pool.http.post(
                        self.url, json=body, timeout=aiohttp.ClientTimeout(
                            total=None, connect=min(self.connect_timeout_s, left))) as answer:
                    status, content = answer.status, await answer.read()
                    retry_after = answer.headers.get("retry-after", "")
            except RETRY_ERRORS as exc:
                problem = f"ConnectError: {type(exc).__name__}: {exc}"
            except TimeoutError:
                raise SandboxRequestError(f"request to {self.url} failed: ReadTimeout: no answer within its "
                                          f"deadline of {budget:g} s", attempt + 1) from None
            except aiohttp.ClientError as exc:
                raise SandboxRequestError(f"request to {self.url} failed: {type(exc).__name__}: {exc}",
                                          attempt + 1) from None
            else:
                if status == 200:
                    try:
                        return RunCodeResponse.model_validate_json(content), attempt + 1
                    except ValidationError as exc:
                        raise SandboxRequestError(
                            f"{self.url} answered with an unexpected body: {exc.errors()[0]['msg']}", attempt + 1
                        ) from None
                text = content[:500].decode(errors="replace")
                problem = f"HTTP {status}: {text}"
                if status not in RETRY_STATUS:
                    raise SandboxRequestError(f"{self.url} answered {problem}", attempt + 1)
            finally:
                pool.admission.release()
            if attempt + 1 < self.max_attempts:
                delay = self._delay(attempt, retry_after)
                if loop.time() + delay >= deadline:
                    break  # no time left for another attempt
                await asyncio.sleep(delay)
        raise SandboxRequestError(f"{self.url} failed after {attempt + 1} attempts: {problem}", attempt + 1)

    async def aclose(self) -> None:
        """Leave this loop's pool; the last client to leave closes it."""
        loop = asyncio.get_running_loop()
        if loop not in self._joined:
            return
        self._joined.discard(loop)
        pool = _POOLS.get((self.origin, loop))
        if pool is None:
            return
        pool.users -= 1
        if pool.users <= 0:
            del _POOLS[(self.origin, loop)]
            await pool.http.close()
