"""An environment server: any registered session kind served over HTTP/WebSocket (``toolrl env serve``),
one WebSocket per trajectory, at most ``capacity`` at once (a client asking for more gets HTTP 503).

Each session runs through :class:`toolrl.sessions.SessionRun`, as in a rollout: every call under the
kind's deadline, its failures told apart (the session's code, or the environment: ``infrastructure``).
A session is closed whatever ends its WebSocket: a ``close`` request, the client gone, the server
stopping."""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import WSMsgType, web
from toolrl import InfrastructureError
from toolrl.config import ConfigError
from toolrl.environments import get_environment
from toolrl.plugins.parts import registered_parts
from toolrl.schemas import Sample, ToolCall
from toolrl.sessions import EnvironmentSession, SessionError, SessionKind, SessionRun
from toolrl.tools import Tool
from toolrl.trajectory import Trajectory

from toolrl_fleet.protocol import HEALTH_PATH, MAX_MESSAGE, SESSION_PATH, CallReply, CallRequest, Health


class ServedSession:
    """One trajectory's session on the server: each request answered by a :class:`CallReply`."""

    def __init__(self, kind: SessionKind, trajectory_id: str) -> None:
        self.session_run = SessionRun(kind, trajectory_id)

    async def handle(self, request: CallRequest) -> CallReply:
        session_run = self.session_run
        try:
            if request.op == "reset":
                return self._reset(await session_run.reset(Sample.model_validate(request.sample or {})))
            if session_run.session is None:
                return CallReply(error=f"session {session_run.name!r}: {request.op} before a successful reset")
            if request.op == "step":
                return await self._guarded("step", session_run.step, ToolCall.model_validate(request.call or {}))
            if request.op == "respond":
                return CallReply(value=await session_run.respond(request.message or ""))
            if request.op == "state_key":
                return CallReply(value=await session_run.state_key())
            if request.op == "score":
                return await self._guarded("score", session_run.session.score,
                                           Trajectory.model_validate(request.trajectory or {}))
            await session_run.close()
            return CallReply()
        except SessionError as exc:  # respond, state_key: recorded by the run
            return CallReply(error=str(exc), infrastructure=session_run.infrastructure)

    def _reset(self, reset: Any) -> CallReply:
        session_run = self.session_run
        if session_run.error is not None:
            return CallReply(error=session_run.error, infrastructure=session_run.infrastructure)
        if any(isinstance(tool, Tool) for tool in reset.tools):
            return CallReply(error=f"session {session_run.name!r} reset hands out Tool objects, which cannot cross "
                               "to a remote client: only tools given as schemas can be served")
        return CallReply(value=reset.model_dump(mode="json"))

    async def _guarded(self, method: str, fn: Any, arg: Any) -> CallReply:
        session_run = self.session_run
        try:
            value = await session_run.guarded(method, fn, arg)
        except SessionError as exc:  # a timeout is the environment's deadline: infrastructure
            return CallReply(error=str(exc), infrastructure=isinstance(exc, InfrastructureError)
                             or session_run.infrastructure)
        return CallReply(value=value.model_dump(mode="json") if hasattr(value, "model_dump") else value)


class SessionServer:
    """The aiohttp application serving ``kind`` (prepared already) as ``served``."""

    def __init__(self, kind: SessionKind, served: str, capacity: int) -> None:
        self.kind, self.served, self.capacity = kind, served, capacity
        self.open = 0
        self.app = web.Application()
        self.app.router.add_get(HEALTH_PATH, self.health)
        self.app.router.add_get(SESSION_PATH, self.session)

    async def health(self, request: web.Request) -> web.Response:
        health = Health(served=self.served, session=self.kind.name, timeout_s=self.kind.cls.timeout,
                        capacity=self.capacity, open=self.open,
                        state_key=self.kind.cls.state_key is not EnvironmentSession.state_key)
        return web.json_response(health.model_dump())

    async def session(self, request: web.Request) -> web.StreamResponse:
        if self.open >= self.capacity:
            return web.json_response({"error": f"at capacity ({self.capacity} sessions)"}, status=503)
        self.open += 1
        ws = web.WebSocketResponse(max_msg_size=MAX_MESSAGE)
        served = ServedSession(self.kind, request.query.get("trajectory_id", ""))
        try:
            await ws.prepare(request)
            async for message in ws:
                if message.type != WSMsgType.TEXT:
                    break
                call = CallRequest.model_validate_json(message.data)
                await ws.send_str((await served.handle(call)).model_dump_json())
                if call.op == "close":
                    break
        finally:
            await asyncio.shield(served.session_run.close())  # always, the client gone or not
            self.open -= 1
            await ws.close()
        return ws


async def serve(kind: SessionKind, served: str, host: str, port: int, capacity: int) -> tuple[web.AppRunner, int]:
    """Prepare ``kind`` and serve it on ``host:port`` (0: a free port); the runner and the port bound."""
    await kind.prepare()
    server = SessionServer(kind, served, capacity)
    runner = web.AppRunner(server.app, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=4096)
    try:
        await site.start()
    except OSError as exc:  # the port taken, the address not this machine's
        await runner.cleanup()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return runner, runner.addresses[0][1]


def served_kind(name: str, options: dict[str, Any]) -> SessionKind:
    """What ``toolrl env serve NAME`` serves: the session of the environment ``name`` (adapted to
    ``options``, its env_options) or, when no environment has that name, the session kind ``name``
    with ``options``. A ConfigError names what is wrong."""
    if name in {part.name for part in registered_parts("environments")}:
        env, _ = get_environment(name, "NAME").resolve(options, "--options")
        if env.session is None:
            raise ConfigError(f"NAME: environment {name!r} has no session to serve (its tools run in the rollout)")
        return SessionKind.resolve(env.session, env.session_options, Path.cwd(), where="NAME",
                                   options_where=f"environment {name!r} session_options")
    return SessionKind.resolve(name, options, Path.cwd(), where="NAME", options_where="--options")


async def run_server(kind: SessionKind, served: str, host: str, port: int, capacity: int,
                     until_stdin_closes: bool, started: Callable[[str], None]) -> None:
    """Serve until SIGINT/SIGTERM (or stdin's end, ``until_stdin_closes``: the parent that started this
    server gone); ``started`` gets the base URL once it listens."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if until_stdin_closes:
        def wait_for_eof() -> None:
            sys.stdin.buffer.read()
            loop.call_soon_threadsafe(stop.set)

        threading.Thread(target=wait_for_eof, daemon=True).start()
    runner, bound = await serve(kind, served, host, port, capacity)
    try:
        started(f"http://{host}:{bound}")
        await stop.wait()
    finally:
        await runner.cleanup()
        await kind.close()
