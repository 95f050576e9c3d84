"""A SandboxFusion-compatible HTTP server on the embedded sandbox (``toolrl sandbox serve``).

Same endpoints, request fields, response fields and status values as SandboxFusion's server:
``POST /run_code`` and ``GET /v1/ping`` (-> ``"pong"``); invalid requests get FastAPI-shaped 422
bodies. For clusters where SandboxFusion's container cannot run.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from toolrl_sandbox_fusion.embedded import EmbeddedSandbox, SandboxConfig
from toolrl_sandbox_fusion.models import RunCodeRequest, RunCodeResponse


def _unprocessable(errors: list[dict[str, Any]]) -> JSONResponse:
    return JSONResponse({"detail": errors}, status_code=422)


def create_app(sandbox: EmbeddedSandbox) -> Starlette:
    async def run_code(request: Request) -> JSONResponse:
        try:
            body = await request.json()
        except ValueError as exc:
            return _unprocessable([{"type": "json_invalid", "loc": ["body"], "msg": f"JSON decode error: {exc}"}])
        try:
            run = RunCodeRequest.model_validate(body)
        except ValidationError as exc:
            return _unprocessable([
                {"type": e["type"], "loc": ["body", *e["loc"]], "msg": e["msg"], "input": e.get("input")}
                for e in exc.errors(include_url=False, include_context=False)
            ])
        try:
            response = await sandbox.arun(run)
        except Exception as exc:  # the server's contract: failures are SandboxError responses
            response = RunCodeResponse.sandbox_error(f"exception on running code: {type(exc).__name__}: {exc}")
        return JSONResponse(response.model_dump(mode="json"))

    async def ping(request: Request) -> JSONResponse:
        return JSONResponse("pong")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        sandbox.start()
        try:
            yield
        finally:
            sandbox.close()

    return Starlette(
        routes=[Route("/run_code", run_code, methods=["POST"]), Route("/v1/ping", ping, methods=["GET"])],
        lifespan=lifespan,
    )


def serve(host: str = "127.0.0.1", port: int = 8080, config: SandboxConfig | None = None,
          log_level: str = "warning") -> None:
    """Serve until SIGINT/SIGTERM. Port 0 picks a free port; the address is printed on stdout."""
    import uvicorn

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on sockets that say so, and without it
    # small responses stall ~40 ms on delayed ACKs.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)  # connections made before uvicorn accepts wait in the backlog, not refused
    sandbox = EmbeddedSandbox(config)
    server = uvicorn.Server(uvicorn.Config(create_app(sandbox), log_level=log_level, access_log=False))
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    print(f"toolrl sandbox: serving on http://{shown}:{bound} (isolation: {sandbox.mode})", flush=True)
    server.run(sockets=[sock])
