"""The gateway's HTTP side: one aiohttp server per rollout process, on loopback, serving every open
episode under its own path.

``/e/{episode}/v1`` is an episode's OpenAI base URL (``GET models``, ``POST chat/completions``,
``POST responses``: :mod:`toolrl.gateway.responses`); ``/e/{episode}`` its Anthropic base URL (``POST
v1/messages``: :mod:`toolrl.gateway.anthropic`); ``POST /e/{episode}/reward`` takes its rewards. Each episode has its own key: a request without it
(``Authorization: Bearer KEY``) is a 401, one for an episode that ended a 404, a malformed one the
400 the OpenAI API would give; none of them ever reaches another episode. An episode's path closes
when its program ends or is cut at its deadline (toolrl.gateway.run): whatever it left running
calls into a 404, and the gateway keeps nothing of it.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from toolrl.gateway.agent_loop import AgentLoop
from toolrl.gateway.anthropic import answer
from toolrl.gateway.protocol import ChatRequest, RequestError, parse_body
from toolrl.gateway.responses import respond
from toolrl.gateway.session import GatewaySession

log = logging.getLogger(__name__)

MAX_BODY = 64 << 20  # bytes: an agent resends its whole conversation with every call


class Gateway:
    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.sessions: dict[str, GatewaySession] = {}
        self.port = 0
        self._runner: Any = None
        self.agents = AgentLoop()  # where in-process programs run (toolrl.gateway.agent_loop)

    async def start(self) -> None:
        from aiohttp import web

        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_get("/e/{episode}/v1/models", self._models)
        app.router.add_post("/e/{episode}/v1/chat/completions", self._chat)
        app.router.add_post("/e/{episode}/v1/responses", self._responses)
        app.router.add_post("/e/{episode}/v1/messages", self._messages)
        app.router.add_post("/e/{episode}/reward", self._reward)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, 0, backlog=4096)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def close(self) -> None:
        await self.agents.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self.sessions.clear()

    def url(self, key: str) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/e/{key}"

    def open(self, key: str, session: GatewaySession) -> None:
        self.sessions[key] = session

    def close_session(self, key: str) -> GatewaySession | None:
        return self.sessions.pop(key, None)

    # -- handlers -----------------------------------------------------------------------------

    def _session(self, request: Any) -> GatewaySession:
        session = self.sessions.get(request.match_info["episode"])
        if session is None:
            raise RequestError("no open episode at this URL (it ended, or never began)", 404)
        auth = request.headers.get("Authorization", "")
        if auth != f"Bearer {session.api_key}" and request.headers.get("x-api-key") != session.api_key:
            raise RequestError("the API key is not this episode's", 401)
        return session

    async def _answer(self, request: Any, handle: Any, anthropic: bool = False) -> Any:
        """``handle(session)``'s answer: JSON, or a stream of server-sent events; errors in the body
        format of the API called (OpenAI's, or Anthropic's)."""
        from aiohttp import web

        try:
            result = await handle(self._session(request))
        except Exception as exc:  # one call's failure is its own, never the gateway's
            if not isinstance(exc, RequestError):
                log.exception("gateway call failed")
                exc = RequestError(f"{type(exc).__name__}: {exc}", 500)
            return web.json_response(exc.anthropic_body() if anthropic else exc.body(), status=exc.status)
        if isinstance(result, dict):
            return web.json_response(result, dumps=lambda d: json.dumps(d, ensure_ascii=False))
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await stream.prepare(request)
        async for event in result:
            await stream.write(event.encode())
        await stream.write_eof()
        return stream

    async def _models(self, request: Any) -> Any:
        async def handle(session: GatewaySession) -> Any:
            return session.models()
        return await self._answer(request, handle)

    async def _chat(self, request: Any) -> Any:
        async def handle(session: GatewaySession) -> Any:
            return await session.chat(parse_body(await request.read(), ChatRequest))
        return await self._answer(request, handle)

    async def _responses(self, request: Any) -> Any:
        async def handle(session: GatewaySession) -> Any:
            return await respond(session, await request.read())
        return await self._answer(request, handle)

    async def _messages(self, request: Any) -> Any:
        async def handle(session: GatewaySession) -> Any:
            return await answer(session, await request.read())
        return await self._answer(request, handle, anthropic=True)

    async def _reward(self, request: Any) -> Any:
        async def handle(session: GatewaySession) -> Any:
            try:
                body = json.loads(await request.read())
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise RequestError(f"the request body is not JSON: {exc}") from None
            return session.set_reward(body)
        return await self._answer(request, handle)
