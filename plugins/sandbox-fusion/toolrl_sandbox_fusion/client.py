"""Async client for a SandboxFusion server's ``POST /run_code`` (or ``toolrl sandbox serve``).

Sends the raw JSON body, so ``memory_limit_MB`` reaches the server (the PyPI client's request model
drops it). Retries only what is safe and likely to pass on a second try: connection failures and
HTTP 429/502/503/504, with exponential backoff, full jitter and ``Retry-After``. A SandboxFusion
``SandboxError`` in a 200 response is a result, not retried: it usually repeats (unknown language).
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import httpx
from pydantic import ValidationError
from toolrl.schemas import InfrastructureError

from toolrl_sandbox_fusion.models import RunCodeRequest, RunCodeResponse

RETRY_STATUS = frozenset({429, 502, 503, 504})
# Connection-level failures: the request never reached the server, or the connection broke before
# any answer. (A read timeout is not retried: the code may be running, and would run twice.)
RETRY_ERRORS = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.RemoteProtocolError)


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


class SandboxFusionClient:
    """One :class:`httpx.AsyncClient` per event loop (a client cannot be shared across loops)."""

    def __init__(self, url: str, *, max_attempts: int = 4, backoff_s: float = 0.25, max_backoff_s: float = 8.0,
                 max_connections: int = 32, connect_timeout_s: float = 5.0, timeout_slack_s: float = 10.0) -> None:
        self.url = run_code_url(url)
        self.max_attempts = max(1, max_attempts)
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.max_connections = max_connections
        self.connect_timeout_s = connect_timeout_s
        self.timeout_slack_s = timeout_slack_s
        self._clients: dict[asyncio.AbstractEventLoop, httpx.AsyncClient] = {}

    def _client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            for old in [lp for lp in self._clients if lp.is_closed()]:
                del self._clients[old]
            client = httpx.AsyncClient(
                limits=httpx.Limits(max_connections=self.max_connections,
                                    max_keepalive_connections=self.max_connections),
                trust_env=False,
            )
            self._clients[loop] = client
        return client

    def _delay(self, attempt: int, response: httpx.Response | None) -> float:
        if response is not None:
            retry_after = response.headers.get("retry-after", "")
            if retry_after.replace(".", "", 1).isdigit():
                return min(float(retry_after), self.max_backoff_s)
        return random.uniform(0, min(self.max_backoff_s, self.backoff_s * 2 ** attempt))

    async def run_code(self, request: RunCodeRequest) -> tuple[RunCodeResponse, int]:
        """The server's response and the number of attempts it took."""
        body: dict[str, Any] = request.model_dump(mode="json")
        # verl's budget: the run and compile limits plus slack for queueing on the server.
        timeout = httpx.Timeout(request.run_timeout + request.compile_timeout + self.timeout_slack_s,
                                connect=self.connect_timeout_s)
        problem = ""
        for attempt in range(self.max_attempts):
            response: httpx.Response | None = None
            try:
                response = await self._client().post(self.url, json=body, timeout=timeout)
            except RETRY_ERRORS as exc:
                problem = f"{type(exc).__name__}: {exc}"
            except httpx.HTTPError as exc:
                raise SandboxRequestError(f"request to {self.url} failed: {type(exc).__name__}: {exc}",
                                          attempt + 1) from None
            else:
                if response.status_code == 200:
                    try:
                        return RunCodeResponse.model_validate_json(response.content), attempt + 1
                    except ValidationError as exc:
                        raise SandboxRequestError(
                            f"{self.url} answered with an unexpected body: {exc.errors()[0]['msg']}", attempt + 1
                        ) from None
                problem = f"HTTP {response.status_code}: {response.text[:500]}"
                if response.status_code not in RETRY_STATUS:
                    raise SandboxRequestError(f"{self.url} answered {problem}", attempt + 1)
            if attempt + 1 < self.max_attempts:
                await asyncio.sleep(self._delay(attempt, response))
        raise SandboxRequestError(f"{self.url} failed after {self.max_attempts} attempts: {problem}",
                                  self.max_attempts)

    async def aclose(self) -> None:
        clients, self._clients = self._clients, {}
        loop = asyncio.get_running_loop()
        for owner, client in clients.items():
            if owner is loop:
                await client.aclose()
