"""``toolrl serve``: the configured engine, model, chat template and tool parser behind an
OpenAI-compatible HTTP API (starlette on uvicorn).

Routes: ``GET /v1/models``, ``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /health``.
Engines return whole generations, so a streamed response sends its chunks once the generation is
done (the SSE protocol is the same; only the first chunk comes later).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from toolrl.gateway.protocol import ChatRequest, CompletionRequest, RequestError, parse_body

from toolrl_openai.conversations import Conversations
from toolrl_openai.service import Service

log = logging.getLogger(__name__)


def build_app(service: Service, sweep_s: float = 30.0) -> Starlette:
    async def answer(request: Request, kind: Any, handler: Any) -> Response:
        try:
            result = await handler(parse_body(await request.body(), kind))
        except RequestError as exc:
            return JSONResponse(exc.body(), status_code=exc.status)
        except Exception as exc:  # one request's failure is its own, never the server's
            log.exception("request failed")
            error = RequestError(f"{type(exc).__name__}: {exc}", 500)
            return JSONResponse(error.body(), status_code=500)
        if isinstance(result, dict):
            return JSONResponse(result)
        return StreamingResponse(result, media_type="text/event-stream")

    async def models(request: Request) -> Response:
        return JSONResponse(service.models())

    async def chat(request: Request) -> Response:
        return await answer(request, ChatRequest, service.chat)

    async def completions(request: Request) -> Response:
        return await answer(request, CompletionRequest, service.complete)

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "open_conversations": len(service.conversations)})

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async def sweep() -> None:
            while True:
                await asyncio.sleep(sweep_s)
                service.conversations.expire()

        task = asyncio.create_task(sweep())
        try:
            yield
        finally:
            task.cancel()
            service.conversations.close_all()
            await service.engine.close()

    return Starlette(routes=[
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
    ], lifespan=lifespan)


def build_service(config: Any, record_dir: Path | None, idle_s: float, max_conversations: int,
                  model_name: str | None, token_history: bool = False) -> Service:
    """Compose the configured parts the way training does; ConfigError/RegistryError on bad config."""
    from toolrl.plugin_support import build_served_model

    served = build_served_model(config)
    conversations = Conversations(served.tokenizer, record_dir, idle_s=idle_s, max_open=max_conversations,
                                  on_close=served.engine.end_session)
    return Service(served.engine, served.tokenizer, served.parser, model_name or config.model.source, conversations,
                   default_max_tokens=config.rollout.max_new_tokens, token_history=token_history,
                   processor=served.processor, image_limits=config.rollout.images)


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)  # clients that connect before uvicorn accepts wait in the backlog
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


async def serve_async(config: Any, host: str, port: int, record_dir: Path | None = None, idle_s: float = 600.0,
                      max_conversations: int = 4096, model_name: str | None = None, token_history: bool = False,
                      announce: Any = print) -> None:
    import uvicorn

    sock = bind(host, port)  # before loading the model: a taken port fails fast
    try:
        service = build_service(config, record_dir, idle_s, max_conversations, model_name, token_history)
        app = build_app(service, sweep_s=max(0.5, min(30.0, idle_s / 4)))
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=10))
        bound = sock.getsockname()[1]
        shown = f"[{host}]" if ":" in host else host
        announce(f"serving {service.model_name} at http://{shown}:{bound}/v1"
                 + (f", recording to {record_dir}" if record_dir else ""))
        await server.serve(sockets=[sock])
    finally:
        sock.close()
