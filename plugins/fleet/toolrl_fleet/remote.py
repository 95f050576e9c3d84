"""The ``fleet`` session kind: each trajectory's session runs on one server of a fleet of environment
servers (``toolrl env serve``), given as ``urls`` or started for the run (``serve``: ``servers`` processes
of an environment on this machine, started again when one dies; ``ray_servers`` Ray actors on the
cluster's nodes, started again by Ray on a node with room when theirs is lost).

Affinity: a trajectory holds one WebSocket to one server from reset to close, so all its calls reach
the session that server holds. Its score is the reward term of the kind that server serves (its
``/health``'s ``session``), as where that kind runs in the rollout's process. A server that dies ends
only its own sessions, each with an :class:`toolrl.InfrastructureError` (termination ``infra_error``:
masked, not trained); it is marked down, no new trajectory goes to it, and it is asked again every
``retry_s`` until it answers. A server that refuses a new trajectory (down, full) passes it to the next."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, model_validator
from toolrl import InfrastructureError
from toolrl.schemas import Sample, ToolCall
from toolrl.sessions import EnvironmentSession, Reset, SessionContext, StepResult
from toolrl.trajectory import Trajectory

from toolrl_fleet.launch import LocalServer
from toolrl_fleet.protocol import CallReply, CallRequest
from toolrl_fleet.ray_servers import start_actors

if TYPE_CHECKING:
    import aiohttp

    from toolrl_fleet.members import Fleet, Member


PREPARE_S = 300.0


class FleetOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    urls: list[str] = Field(default_factory=list, description="base URLs of running environment servers")
    serve: str | None = Field(None, description="an environment (or session kind) to start servers of here")
    serve_options: dict[str, Any] = Field(default_factory=dict, description="its options (toolrl env serve --options)")
    servers: int = Field(0, ge=0, description="how many servers of `serve` to start on this machine")
    ray_servers: int = Field(0, ge=0, description="how many servers of `serve` to start as Ray actors, spread "
                             "over the cluster's nodes that have room (restarted elsewhere when a node is lost)")
    ray_num_cpus: float = Field(1.0, ge=0, description="the CPUs each such actor asks of its node")
    capacity: int = Field(256, gt=0, description="sessions each started server holds at most")
    timeout_s: float = Field(70.0, gt=0, description="each call's deadline here: the served kind's plus the network")
    queue_timeout_s: float = Field(60.0, ge=0, description="how long a trajectory waits for a server with room")
    retry_s: float = Field(2.0, gt=0, description="how often a server that is down is asked again")
    connect_timeout_s: float = Field(10.0, gt=0)
    startup_timeout_s: float = Field(120.0, gt=0, le=PREPARE_S - 10,
                                     description="how long started servers may take to answer")

    @model_validator(mode="after")
    def _some_server(self) -> FleetOptions:
        started = self.servers + self.ray_servers
        if bad := [u for u in self.urls if urlsplit(u).scheme not in ("http", "https") or not urlsplit(u).hostname]:
            raise ValueError(f"urls: {bad[0]!r} is not a URL (http://HOST:PORT)")
        if not self.urls and not (self.serve and started):
            raise ValueError("give urls (running servers) or serve and servers or ray_servers (servers to start)")
        if started and not self.serve:
            raise ValueError("servers and ray_servers need serve: the environment they serve")
        return self


class RemoteError(RuntimeError):
    """The served session failed (its own code, not the environment): the server's message."""


class FleetSession(EnvironmentSession):
    """One trajectory's session on one server of the route's fleet (see the module)."""

    Options = FleetOptions
    timeout = PREPARE_S  # the kind's prepare (starting servers); each call's is options.timeout_s
    serves = True  # scored as the kind its servers serve (term: set at reset)

    def __init__(self, options: FleetOptions, context: SessionContext) -> None:
        super().__init__(options, context)
        self.timeout = options.timeout_s
        self.link: tuple[Member, aiohttp.ClientWebSocketResponse] | None = None
        self.fleet: Fleet | None = None

    @classmethod
    async def prepare(cls, options: FleetOptions, context: SessionContext) -> None:
        await context.shared.get("fleet", lambda: _fleet(options), lambda fleet: fleet.close())

    async def _call(self, request: CallRequest) -> Any:
        import aiohttp

        assert self.link is not None and self.fleet is not None
        member, ws = self.link
        try:
            await ws.send_str(request.model_dump_json(exclude_none=True))
            message = await ws.receive()
        except (aiohttp.ClientError, ConnectionError, RuntimeError) as exc:
            raise self.fleet.lost(member, exc) from None
        if message.type != aiohttp.WSMsgType.TEXT:
            raise self.fleet.lost(member, f"its WebSocket ended ({message.type.name})")
        reply = CallReply.model_validate_json(message.data)
        if reply.error is not None:
            raise (InfrastructureError if reply.infrastructure else RemoteError)(reply.error)
        return reply.value

    async def reset(self, sample: Sample) -> Reset:
        self.fleet = await self.context.shared.get("fleet", _unprepared)
        self.link = await self.fleet.connect(self.context.trajectory_id, self.options.queue_timeout_s)
        self.term = self.link[0].session  # scored as the served kind is where it runs locally
        value = await self._call(CallRequest(op="reset", sample=sample.model_dump(mode="json"),
                                         trajectory_id=self.context.trajectory_id))
        return Reset.model_validate(value)

    async def step(self, call: ToolCall) -> StepResult:
        return StepResult.model_validate(await self._call(CallRequest(op="step", call=call.model_dump(mode="json"))))

    async def respond(self, message: str) -> str | None:
        return await self._call(CallRequest(op="respond", message=message))

    async def state_key(self) -> str | None:
        if self.link is None or not self.link[0].state_key:  # the served kind keys no state: no round trip
            return None
        return await self._call(CallRequest(op="state_key"))

    async def score(self, trajectory: Trajectory) -> float | Mapping[str, float] | None:
        return await self._call(CallRequest(op="score", trajectory=trajectory.model_dump(mode="json")))

    async def close(self) -> None:
        import aiohttp

        link, self.link = self.link, None
        if link is None or self.fleet is None:
            return
        member, ws = link
        try:
            if not ws.closed:
                await ws.send_str(CallRequest(op="close").model_dump_json(exclude_none=True))
                await ws.receive()  # the server closed the session
        except (aiohttp.ClientError, ConnectionError, RuntimeError):
            pass  # the server is gone, and its session with it
        finally:
            await ws.close()
            self.fleet.release(member)


async def _fleet(options: FleetOptions) -> Fleet:
    from toolrl_fleet.members import Fleet  # aiohttp: imported only when a fleet is used

    local = [LocalServer(options.serve, options.serve_options, options.capacity)
             for _ in range(options.servers if options.serve else 0)]
    actors = start_actors(options.ray_servers, options.serve, options.serve_options, options.capacity,
                          options.ray_num_cpus) if options.serve and options.ray_servers else []
    fleet = Fleet(options.urls, local, options.retry_s, options.connect_timeout_s, actors)
    try:
        await fleet.start(options.startup_timeout_s)
    except BaseException:
        await fleet.close()
        raise
    return fleet


async def _unprepared() -> Fleet:
    raise InfrastructureError("the fleet session kind was not prepared (its routes were not built)")
