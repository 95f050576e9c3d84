"""A SandboxFusion-compatible HTTP server on the embedded sandbox (``toolrl sandbox serve``).

Same endpoints, request fields, response fields and status values as SandboxFusion's server:
``POST /run_code``, ``POST /run_jupyter`` and ``GET /v1/ping`` (-> ``"pong"``). Errors come in FastAPI's shapes, as
SandboxFusion (a FastAPI app) sends them: 404/405 as ``{"detail": "Not Found"}``, invalid requests
as 422 ``{"detail": [...]}`` with each pydantic error's ``url``, as the FastAPI and pydantic that
SandboxFusion pins (0.103, 2.6) include it. For clusters where SandboxFusion's container cannot run.
"""

from __future__ import annotations

import contextlib
import email.message
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

from pydantic import TypeAdapter, ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from toolrl_sandbox_fusion.embedded import EmbeddedSandbox, SandboxConfig
from toolrl_sandbox_fusion.models import (
    RunCodeRequest,
    RunCodeResponse,
    RunJupyterRequest,
    RunJupyterResponse,
    RunStatus,
)

_REQUEST = TypeAdapter(RunCodeRequest)
_JUPYTER_REQUEST = TypeAdapter(RunJupyterRequest)


def _unprocessable(errors: list[dict[str, Any]]) -> JSONResponse:
    # As FastAPI's encoder: bytes decoded, anything else JSON cannot hold (exceptions in ctx) as text.
    def text(value: object) -> str:
        return value.decode(errors="replace") if isinstance(value, bytes) else str(value)

    return JSONResponse(json.loads(json.dumps({"detail": errors}, default=text)), status_code=422)


def _is_json(content_type: str | None) -> bool:
    if not content_type:
        return True
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (subtype == "json" or subtype.endswith("+json"))


async def _parse(request: Request, adapter: TypeAdapter[Any] = _REQUEST) -> Any:
    """The body as FastAPI reads a JSON body parameter, with its error shapes."""
    raw = await request.body()
    body: Any = None
    if raw:
        body = raw
        if _is_json(request.headers.get("content-type")):
            try:
                body = json.loads(raw)
            except json.JSONDecodeError as exc:
                return _unprocessable([{"type": "json_invalid", "loc": ["body", exc.pos], "msg": "JSON decode error",
                                        "input": {}, "ctx": {"error": exc.msg}}])
    if body is None:  # as FastAPI 0.103 makes it: pydantic's "missing" error (with its url), input None
        missing = {"type": "missing", "loc": ("body",), "input": {}}
        error = ValidationError.from_exception_data("Field required", [missing]).errors()[0]  # type: ignore[list-item]
        return _unprocessable([{**error, "input": None}])
    try:
        return adapter.validate_python(body, from_attributes=True)
    except ValidationError as exc:
        return _unprocessable([{**e, "loc": ["body", *e["loc"]]} for e in exc.errors()])


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)


def create_app(sandbox: EmbeddedSandbox) -> Starlette:
    async def run_code(request: Request) -> JSONResponse:
        run = await _parse(request)
        if isinstance(run, JSONResponse):
            return run
        try:
            response = await sandbox.arun(run)
        except Exception as exc:  # the server's contract: failures are SandboxError responses
            response = RunCodeResponse.sandbox_error(f"exception on running code: {type(exc).__name__}: {exc}")
        return JSONResponse(response.model_dump(mode="json"))

    async def run_jupyter(request: Request) -> JSONResponse:
        run = await _parse(request, _JUPYTER_REQUEST)
        if isinstance(run, JSONResponse):
            return run
        try:
            response = await sandbox.arun_jupyter(run)
        except Exception as exc:  # as /run_code: failures are SandboxError responses
            response = RunJupyterResponse(status=RunStatus.SandboxError,
                                          message=f"exception on running jupyter: {type(exc).__name__}: {exc}")
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

    ping_route = Route("/v1/ping", ping, methods=["GET"])
    ping_route.methods = {"GET"}  # as FastAPI: no implicit HEAD (a 405 names only GET)
    return Starlette(
        routes=[Route("/run_code", run_code, methods=["POST"]), Route("/run_jupyter", run_jupyter, methods=["POST"]),
                ping_route],
        exception_handlers={HTTPException: _http_error},
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
