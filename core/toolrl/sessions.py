"""Environment sessions: the per-trajectory state of an environment (a simulated user, a server-side
episode, a database copy), registered through ``register_environment_sessions`` and named by an
environment (``Environment.session``) or a config (``session.name``).

Contract, per trajectory: the table in docs/plugins.md, "Adding an environment session", and the methods
of :class:`EnvironmentSession` (each may be ``async def`` or a plain ``def``, which runs in a thread).

The rollout loop drives a session through :class:`SessionRun`, which contains every fault: a session that
raises, hangs (``EnvironmentSession.timeout``) or breaks its contract ends that trajectory with an
``error``, never another one (a mistake of the model is a ``StepResult`` with an error response, which the
model reads); an :class:`~toolrl.schemas.InfrastructureError` or a missed deadline ends it with
``infra_error``. The tools a reset hands out run through :class:`toolrl.tools.ToolSet` as
:class:`SessionTool` objects, whose ``execute`` is the session's ``step``.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from toolrl.config import format_errors
from toolrl.plugins.parts import BuildContext, NoOptions, build_found, checked_options, lookup_part
from toolrl.plugins.registry import describe_exception
from toolrl.rewards.scoring import RewardValueError, coerce_reward, named_terms
from toolrl.schemas import InfrastructureError, Sample, ToolCall, ToolResponse, ToolResult, ToolSchema
from toolrl.tools import Tool, ToolReturnError
from toolrl.tools.guard import in_thread, run_guarded
from toolrl.trajectory import Trajectory

log = logging.getLogger("toolrl.sessions")


class Reset(BaseModel):
    """What a trajectory starts with. ``tools``: :class:`toolrl.tools.Tool` objects (run through their
    own lifecycle; the session owns them) or OpenAI function schemas (each call is the session's
    ``step``); they join the route's tools, or replace them (``replace_tools``), and the chat template
    renders them unless ``render_tools`` is false. ``messages``: chat
    messages appended to the sample's prompt (the first observation)."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    tools: list[Any] = Field(default_factory=list)
    replace_tools: bool = False
    # False: the chat template is given no tool schemas (the prompt describes the tools itself, as a prompted
    # format's does); the tools are called all the same.
    render_tools: bool = True
    messages: list[dict[str, Any]] = Field(default_factory=list)


class StepResult(BaseModel):
    """One call's outcome: what the model reads, the step's reward (None: no reward), whether the
    episode is over (``done`` ends the trajectory after this turn's calls) and metrics for the trace."""

    model_config = ConfigDict(extra="forbid")

    response: ToolResponse | str
    reward: float | None = None
    done: bool = False
    metrics: dict[str, Any] = Field(default_factory=dict)


class SessionError(RuntimeError):
    """A session call failed (raised, timed out, or returned what its contract does not allow)."""


class SessionInfrastructureError(SessionError, InfrastructureError):
    """A session call failed because the environment did: it raised InfrastructureError, or missed
    its deadline."""


def failure_after_calls(session: SessionRun, results: Sequence[ToolResult]) -> SessionError | InfrastructureError | None:
    """Why a trajectory ends after its calls ran, although the model may go on: its session failed
    (in a step), or a call failed for the infrastructure (``infra_error``). None: it goes on."""
    if session.error is not None:
        return session.failed()
    broken = next((r for r in results if r.status == "infra_error"), None)
    return None if broken is None else InfrastructureError(broken.response.text)


class SharedParts:
    """What a route's sessions share (a server they talk to, a limit on open episodes): each object
    created once, on first use, and closed when the route closes."""

    def __init__(self) -> None:
        self._made: dict[str, asyncio.Future[Any]] = {}
        self._closers: dict[str, Callable[[Any], Awaitable[None]]] = {}

    async def get(self, key: str, create: Callable[[], Awaitable[Any]],
                  close: Callable[[Any], Awaitable[None]] | None = None) -> Any:
        """``key``'s object; the first caller creates it, the others wait for that same creation. A
        failed creation raises in every waiter and is not kept."""
        made = self._made.get(key)
        if made is None or (made.done() and (made.cancelled() or made.exception() is not None)):
            made = self._made[key] = asyncio.ensure_future(create())
            if close is not None:
                self._closers[key] = close
        return await asyncio.shield(made)

    async def close(self) -> None:
        """Close every created object; a failing close is logged."""
        made, self._made = self._made, {}
        for key, future in made.items():
            if not future.done():
                future.cancel()
                continue
            closer = self._closers.get(key)
            if closer is None or future.cancelled() or future.exception() is not None:
                continue
            try:
                await closer(future.result())
            except Exception:
                log.exception("closing the sessions' shared %r failed", key)
        self._closers.clear()


@dataclass(frozen=True, kw_only=True)
class SessionContext(BuildContext):
    """What a session is built with besides its options (a :class:`BuildContext`, as every part is
    built with: the config fields that named it and hold its options): its kind's name (its reward
    term), the trajectory, the config's directory (relative paths) and what the route's sessions share."""

    name: str
    trajectory_id: str
    base_dir: Path
    shared: SharedParts


class EnvironmentSession:
    """Base class of environment sessions (see the module's contract). Subclasses set ``Options`` (a
    pydantic model, ``extra="forbid"``) and override the methods they need; the defaults hand out no
    tools, give no user turn and no score."""

    Options: ClassVar[type[BaseModel]] = NoOptions
    timeout: ClassVar[float] = 60.0  # each call's deadline (seconds)
    term: str | None = None  # the reward term its score goes under; None: its kind's name
    # Whether it runs the environment's own session kind elsewhere (on a server), each session's ``term``
    # that kind's name: a run's eval.metric may then name the environments' session kinds.
    serves: ClassVar[bool] = False
    # The roles its ``role()`` gives turns to: the run check refuses a kind whose roles the run does not name.
    roles: ClassVar[tuple[str, ...]] = ()

    def __init__(self, options: Any, context: SessionContext) -> None:
        self.options, self.context = options, context

    @classmethod
    async def prepare(cls, options: Any, context: SessionContext) -> None:
        """What every session of a route needs, made once when the routes are built (kept in
        ``context.shared``); raise to refuse the configuration. ``context.trajectory_id`` is empty."""

    @classmethod
    def build(cls, options: Any, context: SessionContext) -> EnvironmentSession:
        """One trajectory's session (may be async)."""
        return cls(options, context)

    async def reset(self, sample: Sample) -> Reset:
        return Reset()

    async def step(self, call: ToolCall) -> StepResult:
        raise NotImplementedError(f"{type(self).__name__} hands out tools as schemas but implements no step()")

    async def respond(self, message: str) -> str | None:
        return None

    async def state_key(self) -> str | None:
        """A key for the environment's current state, equal whenever two trajectories of a group stand
        in the same state (``gigpo`` groups the turns taken from it); None: the rollout keys the
        state by the observation the turn starts from (toolrl.rollout.turns)."""
        return None

    async def role(self) -> str | None:
        """The role that takes the next model turn (one of ``roles``), asked before each turn of a run
        with roles; a change of role starts a new piece of the trajectory (toolrl.rollout.segments).
        None: the role acting goes on (the run's first role at the start)."""
        return None

    async def score(self, trajectory: Trajectory) -> float | Mapping[str, float] | None:
        """None: no reward term."""
        return None

    async def role_rewards(self) -> Mapping[str, float] | None:
        """Each role's own reward (``Trajectory.role_rewards``, which a role's baseline compares), asked
        after ``score`` in a run with roles: a game whose players win and lose against each other.
        A role left out, or None, gets the episode's reward."""
        return None

    async def close(self) -> None:
        """Free the trajectory's resources."""

    async def clone(self) -> EnvironmentSession:
        """An independent session in this one's state (a tree rollout's continuations,
        toolrl.rollout.tree): the two go on apart, each scored and closed. A kind that overrides it can
        clone; this default cannot, and the run check refuses ``rollout.tree`` for it."""
        raise NotImplementedError(f"{type(self).__name__} cannot clone")

    @classmethod
    def gives_turns(cls) -> bool:
        """Whether the kind gives turns to roles (it overrides :meth:`role`)."""
        return cls.role is not EnvironmentSession.role

    @classmethod
    def can_clone(cls) -> bool:
        """Whether the kind's sessions clone (it overrides :meth:`clone`)."""
        return cls.clone is not EnvironmentSession.clone


@dataclass
class SessionKind:
    """A route's session kind: the class, its validated options, what its sessions share, and the
    config fields that named it (``where``) and hold its options (``options_where``)."""

    name: str
    cls: type[EnvironmentSession]
    options: BaseModel
    base_dir: Path
    shared: SharedParts = field(default_factory=SharedParts)
    where: str = "session.name"
    options_where: str = "session.options"

    @classmethod
    def resolve(cls, name: str, options: Mapping[str, Any] | None, base_dir: Path | str,
                where: str = "session.name", options_where: str = "session.options") -> SessionKind:
        """The registered kind ``name`` with ``options`` validated, as every part is (one-line
        ConfigError naming ``where`` or ``options_where``); nothing built or started yet."""
        part = lookup_part("environment_sessions", name, where)
        return cls(name, part, checked_options(part, options, options_where), Path(base_dir),
                   where=where, options_where=options_where)

    def context(self, trajectory_id: str) -> SessionContext:
        return SessionContext(where=self.where, options_where=self.options_where, name=self.name,
                              trajectory_id=trajectory_id, base_dir=self.base_dir, shared=self.shared)

    async def prepare(self) -> None:
        """The kind's ``prepare``, once per route; its failure (or hang) is a ValueError."""
        context = self.context("")
        outcome = await run_guarded(f"session {self.name!r} prepare", self.cls.prepare, (self.options, context), {},
                                self.cls.timeout)
        if outcome.timed_out or outcome.error is not None:
            raise ValueError(f"session {self.name!r}: " + (f"prepare timed out after {self.cls.timeout:g} s"
                                                          if outcome.timed_out else str(outcome.error)))

    async def close(self) -> None:
        await self.shared.close()


class SessionRun:
    """One trajectory's session, every call guarded. Without a kind (``kind=None``) it is inert: no
    tools, no user, no score. Failures of ``reset`` are kept in ``error`` (the loop ends the
    trajectory with it); ``respond`` and ``score`` raise :class:`SessionError`."""

    def __init__(self, kind: SessionKind | None, trajectory_id: str) -> None:
        self.kind, self.trajectory_id = kind, trajectory_id
        self.session: EnvironmentSession | None = None
        self.error: str | None = None
        self.infrastructure = False  # ``error`` is the environment's failure (SessionInfrastructureError)
        self.done = False  # a step reported the episode over
        self.started = False  # reset was fine: the trajectory ran, so it is scored
        self.timeout = EnvironmentSession.timeout  # the built session's, once built
        self.role_rewards: dict[str, float] = {}  # each role's own reward, once finished

    @property
    def name(self) -> str:
        return self.kind.name if self.kind is not None else "session"

    def fail(self, error: str, infrastructure: bool = False) -> None:
        """Record the session's first failure: the loop ends the trajectory with it."""
        if self.error is None:
            self.error, self.infrastructure = error, infrastructure

    def failed(self) -> SessionError:
        """The recorded failure as the exception that ends the trajectory."""
        assert self.error is not None
        return (SessionInfrastructureError if self.infrastructure else SessionError)(self.error)

    async def guarded(self, method: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` under the session's guard and deadline: its value, else a SessionError naming
        ``method`` (a SessionInfrastructureError for the environment's own failure or a timeout)."""
        outcome = await run_guarded(f"session {self.name!r} {method}", fn, args, {}, self.timeout)
        if outcome.timed_out:  # the environment's deadline, not the model's
            raise SessionInfrastructureError(f"session {self.name!r} {method} timed out after {self.timeout:g} s")
        if outcome.error is not None:
            raise (SessionInfrastructureError if outcome.infrastructure else SessionError)(
                f"session {self.name!r} {method}: {outcome.error}")
        return outcome.value

    async def _new_session(self, method: str, fn: Callable[..., Any], *args: Any) -> EnvironmentSession:
        """A session made by ``fn(*args)`` under the guard (``build``, ``clone``), checked to be one."""
        session = await self.guarded(method, fn, *args)
        if not isinstance(session, EnvironmentSession):
            raise SessionError(f"session {self.name!r} {method} returned {type(session).__name__}, "
                               "not an EnvironmentSession")
        return session

    async def reset(self, sample: Sample) -> Reset:
        """Build the session and reset it; on failure, an empty reset and ``error`` set."""
        if self.kind is None:
            return Reset()
        kind = self.kind
        try:  # built as every part is (a plain build runs in a thread, an async one on the loop)
            session = await self._new_session("build", build_found, kind.cls, kind.options,
                                              kind.context(self.trajectory_id))
            self.session, self.timeout = session, session.timeout
            reset = self._checked_reset(await self.guarded("reset", session.reset, sample))
            self.started = True
            return reset
        except SessionError as exc:
            self.fail(str(exc), isinstance(exc, InfrastructureError))
            return Reset()

    async def clone(self, trajectory_id: str) -> SessionRun:
        """The run of trajectory ``trajectory_id``, a continuation of this one: the session cloned
        under the guard, the run's state copied. A clone that fails is the new run's ``error``."""
        twin = SessionRun(self.kind, trajectory_id)
        twin.error, twin.infrastructure, twin.done = self.error, self.infrastructure, self.done
        twin.started, twin.timeout = self.started, self.timeout
        if self.session is not None:
            try:
                twin.session = await self._new_session("clone", self.session.clone)
            except SessionError as exc:
                twin.fail(str(exc), isinstance(exc, InfrastructureError))
        return twin

    def _checked_reset(self, value: Any) -> Reset:
        try:
            reset = value if isinstance(value, Reset) else Reset.model_validate(value)
            for tool in reset.tools:
                if not isinstance(tool, Tool):
                    ToolSchema.model_validate(tool)
        except ValidationError as exc:
            raise SessionError(f"session {self.name!r} reset returned an invalid Reset: {format_errors(exc)}") \
                from None
        return reset

    def tools(self, reset: Reset, route_tools: Mapping[str, Tool]) -> dict[str, Tool]:
        """The trajectory's tools: the route's (unless replaced) and the reset's, schemas as
        :class:`SessionTool`. Two tools of one name: :class:`SessionError`."""
        tools = {} if reset.replace_tools else dict(route_tools)
        for item in reset.tools:
            tool = item if isinstance(item, Tool) else SessionTool(self, item)
            if tool.name in tools:
                raise SessionError(f"session {self.name!r} reset hands out tool {tool.name!r}, which the route "
                                   "has already (set replace_tools to offer only the session's)")
            tools[tool.name] = tool
        return tools

    async def step(self, call: ToolCall) -> StepResult:
        """The session's step, unguarded (its tool's call guards it); the result checked. A step that
        raises or returns junk fails the session (:meth:`fail`): the loop ends the trajectory."""
        assert self.session is not None
        try:
            result = await self._step(self.session, call)
        except Exception as exc:
            self.fail(f"session {self.name!r} step: {describe_exception(exc)}",
                      isinstance(exc, InfrastructureError))
            raise
        self.done = self.done or result.done
        return result

    @staticmethod
    async def _step(session: EnvironmentSession, call: ToolCall) -> StepResult:
        fn = session.step
        value = await fn(call) if inspect.iscoroutinefunction(fn) else await in_thread(fn, (call,), {})
        if inspect.isawaitable(value):
            value = await value
        if isinstance(value, (str, ToolResponse)):
            value = StepResult(response=value)
        try:
            return value if isinstance(value, StepResult) else StepResult.model_validate(value)
        except ValidationError as exc:
            raise ToolReturnError(f"step must return a StepResult: {format_errors(exc)}") from None

    async def respond(self, message: str) -> str | None:
        if self.session is None:
            return None
        return await self._text_or_none("respond", self.session.respond, message)

    async def state_key(self) -> str | None:
        """The session's key for the current state, or None (none given, or no session). A session
        that does not define ``state_key`` is not called: no await, so its loop runs as before."""
        session = self.session
        if session is None or type(session).state_key is EnvironmentSession.state_key:
            return None
        return await self._text_or_none("state_key", session.state_key)

    async def role(self, roles: Sequence[str]) -> str | None:
        """The role the session gives the next turn, one of the run's ``roles``, or None (none given, or
        no session). A role the run does not have fails the session. A session that does not define
        ``role`` is not called."""
        session = self.session
        if session is None or not type(session).gives_turns():
            return None
        role = await self._text_or_none("role", session.role)
        if role is not None and role not in roles:
            self.fail(f"session {self.name!r} role: {role!r} is not one of the run's roles "
                      f"({', '.join(map(repr, roles))})")
            raise self.failed()
        return role

    async def _text_or_none(self, method: str, call: Callable[..., Any], *args: Any) -> str | None:
        """``call(*args)`` through the session's guard, which must give a str or None."""
        try:
            value = await self.guarded(method, call, *args)
        except SessionError as exc:  # recorded: an infrastructure failure leaves nothing to score
            self.fail(str(exc), isinstance(exc, InfrastructureError))
            raise
        if value is not None and not isinstance(value, str):
            raise SessionError(f"session {self.name!r} {method} must return a str or None, "
                               f"got {type(value).__name__}")
        return value

    async def finish(self, traj: Trajectory, roles: Sequence[str] = ()) -> dict[str, float]:
        """Score (when the session started) then close, always; returns the reward terms, and keeps
        each role's reward in ``role_rewards`` (a run with ``roles``). A score that fails is the term 0
        with its error in ``reward_errors``; its reported parts go to ``reward_parts``."""
        if self.session is None:
            return {}
        term = self.session.term or self.name
        try:
            if not self.started or self.infrastructure:  # nothing to score (it is not trained)
                return {}
            value = await self.guarded("score", self.session.score, traj)
            if roles and type(self.session).role_rewards is not EnvironmentSession.role_rewards:
                self.role_rewards = self._checked_role_rewards(await self.guarded("role_rewards", self.session.role_rewards),
                                                               roles)
            return {} if value is None else named_terms(term, value, f"session {self.name!r} score", traj)
        except (SessionError, RewardValueError) as exc:
            traj.reward_errors[term] = str(exc)
            traj.error = traj.error or str(exc)
            if isinstance(exc, InfrastructureError):  # no score to give: the trajectory is not trained
                traj.termination = "infra_error"
            return {term: 0.0}
        finally:
            await self.close(traj)

    def _checked_role_rewards(self, value: Any, roles: Sequence[str]) -> dict[str, float]:
        what = f"session {self.name!r} role_rewards"
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise SessionError(f"{what} must return a mapping of roles to rewards, got {type(value).__name__}")
        unknown = [r for r in value if r not in roles]
        if unknown:
            raise SessionError(f"{what}: {unknown[0]!r} is not one of the run's roles ({', '.join(map(repr, roles))})")
        return {role: coerce_reward(reward, f"{what}[{role!r}]") for role, reward in value.items()}

    async def close(self, traj: Trajectory | None = None) -> None:
        """Close the session once; a failing close is the trajectory's error (or logged without one)."""
        session, self.session = self.session, None
        if session is None:
            return
        try:
            await self.guarded("close", session.close)
        except SessionError as exc:
            if traj is None:
                log.warning("%s", exc)
            else:
                traj.error = traj.error or str(exc)


class SessionTool(Tool):
    """A tool a session handed out as a schema: each call is the session's ``step``, under the
    session's deadline, checked like any tool's ``execute``."""

    def __init__(self, session_run: SessionRun, schema: Mapping[str, Any]) -> None:
        super().__init__({"timeout": session_run.timeout}, schema)
        self.session_run = session_run

    async def execute(self, instance_id: str, arguments: dict[str, Any],
                      **execute_kwargs: Any) -> tuple[ToolResponse | str, float | None, dict[str, Any]]:
        result = await self.session_run.step(ToolCall(name=self.name, arguments=arguments))
        metrics = {**result.metrics, **({"done": True} if result.done else {})}
        return result.response, result.reward, metrics

    async def call(self, instance_id: str, arguments: Any, **execute_kwargs: Any) -> ToolResult:
        """The guarded call; a step past the session's deadline fails the session (the environment's
        deadline: infrastructure)."""
        result = await super().call(instance_id, arguments, **execute_kwargs)
        if result.status == "timeout":
            self.session_run.fail(f"session {self.session_run.name!r} step timed out after {self.timeout:g} s",
                                  infrastructure=True)
        return result

    async def calc_reward(self, instance_id: str, **calc_reward_kwargs: Any) -> None:
        """None: the session scores the trajectory (``score``), not its tools."""
        return None

    async def clone(self, instance_id: str, new_instance_id: str) -> str:
        """Nothing to copy: the state is the session's, cloned with it (a continuation's copy of this
        tool is bound to its cloned session)."""
        return new_instance_id
