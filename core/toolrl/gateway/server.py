"""The gateway's HTTP side: one aiohttp server per rollout process, on loopback, serving every open
episode under its own path.

``/e/{episode}/v1`` is an episode's base URL, where each registered protocol (chat completions, responses,
a plugin's: :mod:`toolrl.gateway.protocols`) serves its path; ``POST /e/{episode}/reward`` takes its
rewards. Each episode has its own key (``Authorization: Bearer``, ``x-api-key`` or ``?key=``), so no
request reaches another episode; once its program ends, whatever it left running calls into a 404.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from toolrl.gateway.agent_loop import AgentLoop
from toolrl.gateway.messages import model_list
from toolrl.gateway.protocol import RequestError, parse_body
from toolrl.gateway.protocols import GatewayProtocol, gateway_protocols
from toolrl.gateway.session import GatewaySession, RewardPost

if TYPE_CHECKING:
    from aiohttp import web

log = logging.getLogger(__name__)

MAX_BODY = 64 << 20  # bytes: an agent resends its whole conversation with every call


class Gateway:
    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.sessions: dict[str, GatewaySession] = {}
        self.port = 0
        self._runner: web.AppRunner | None = None
        self.agents = AgentLoop()  # where in-process programs run (toolrl.gateway.agent_loop)
        self.protocols: list[type[GatewayProtocol]] = []

    async def start(self) -> Gateway:
        from aiohttp import web

        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_get("/e/{episode}/v1/models", self._handler(_models))
        self.protocols = gateway_protocols()
        for protocol in self.protocols:
            app.router.add_post(f"/e/{{episode}}/v1/{protocol.path}", self._handler(partial(_call, protocol),
                                                                                  protocol.error_body))
        app.router.add_post("/e/{episode}/reward", self._handler(_reward))
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, 0, backlog=4096)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def close(self) -> None:
        await self.agents.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self.sessions.clear()

    def url(self, key: str) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/e/{key}"

    def environ(self, key: str, api_key: str) -> dict[str, str]:
        """What points every served protocol's clients at episode ``key``'s endpoint."""
        return {name: value for p in self.protocols for name, value in p.environ(self.url(key), api_key).items()}

    # -- handlers -----------------------------------------------------------------------------

    def _session(self, request: web.Request) -> GatewaySession:
        session = self.sessions.get(request.match_info["episode"])
        if session is None:
            raise RequestError("no open episode at this URL (it ended, or never began)", 404)
        auth = request.headers.get("Authorization", "")
        if session.api_key not in (auth.removeprefix("Bearer "), request.headers.get("x-api-key"), request.query.get("key")):
            raise RequestError("the API key is not this episode's", 401)
        return session

    def _handler(self, handle: Callable[[GatewaySession, web.Request], Awaitable[dict[str, Any] | AsyncIterator[str]]],
                 error_body: Callable[[RequestError], dict[str, Any]] = RequestError.body,
                 ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        """The aiohttp handler of ``handle(session, request)``: its answer as JSON, or as a stream of
        server-sent events; errors in the body format of the API called (``error_body``)."""
        from aiohttp import web

        async def serve(request: web.Request) -> web.StreamResponse:
            try:
                result = await handle(self._session(request), request)
            except Exception as exc:  # one call's failure is its own, never the gateway's
                if not isinstance(exc, RequestError):
                    log.exception("gateway call failed")
                    exc = RequestError(f"{type(exc).__name__}: {exc}", 500)
                return web.json_response(error_body(exc), status=exc.status)
            if isinstance(result, dict):
                return web.json_response(result, dumps=lambda d: json.dumps(d, ensure_ascii=False))
            stream = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await stream.prepare(request)
            async for event in result:
                await stream.write(event.encode())
            await stream.write_eof()
            return stream
        return serve


async def _models(session: GatewaySession, request: web.Request) -> dict[str, Any]:
    """``GET /v1/models``: the run's roles, else the endpoint's one model name."""
    return model_list(list(session.roles) or [session.model])


async def _call(protocol: type[GatewayProtocol], session: GatewaySession,
                request: web.Request) -> dict[str, Any] | AsyncIterator[str]:
    """A protocol's call: ``parse`` the body, ``answer`` it, ``stream`` the answer if asked."""
    req = protocol.parse(await request.read())
    body = await protocol.answer(session, req)
    return protocol.stream(req, body) if req.stream else body


async def _reward(session: GatewaySession, request: web.Request) -> dict[str, Any]:
    return session.set_reward(parse_body(await request.read(), RewardPost))
