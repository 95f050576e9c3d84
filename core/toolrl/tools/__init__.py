"""The Tool base class (per-trajectory lifecycle) and ToolSet (the tools of one trajectory).

Lifecycle, per trajectory (``instance_id``)::

    create(instance_id, **create_kwargs)            once, at trajectory start
    execute(instance_id, arguments, **execute_kwargs) -> (response, step_reward, metrics)   0..n
    calc_reward(instance_id, **calc_reward_kwargs) -> float | {part: float, ...} | None  once
    release(instance_id, **release_kwargs)           once, always (also after errors/timeouts)
    clone(instance_id, new_instance_id)              rollout.tree only: a copy in this state (Tool.can_clone)

Every method may be ``async def`` or a plain ``def`` (plain ones run in a thread). Rollouts,
``toolrl tool call`` and the conformance kit all drive the lifecycle through :class:`ToolSet`, and
:meth:`Tool.call` wraps ``execute``; both contain every fault a tool can have (:mod:`toolrl.tools.guard`,
:mod:`toolrl.tools.isolation`; what each fault becomes: docs/plugins.md, "Tools: faults and isolation").
"""

from __future__ import annotations

import asyncio
import copy
import json
import math
import time
import uuid
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ValidationError

from toolrl.config import format_errors
from toolrl.plugins.parts import UncheckedOptions
from toolrl.rewards.scoring import RewardValueError, coerce_reward, named_parts
from toolrl.schemas import InfrastructureError, ToolCall, ToolKwargs, ToolResponse, ToolResult, ToolSchema
from toolrl.tools.guard import Guarded, run_guarded
from toolrl.tools.shared import SharedResources as SharedResources  # re-exported: one resource per trajectory

# Keys every tool config may carry, handled here rather than by the tool's config model.
BASE_CONFIG_KEYS = ("type", "timeout", "isolation")
Isolation = Literal["none", "process"]


class ToolConfigError(ValueError):
    """A tool config that does not validate; the message names the field."""


class ToolReturnError(TypeError):
    """A lifecycle method returned something its contract does not allow."""


def _kind(value: Any) -> str:
    return type(value).__name__


def coerce_execute_result(value: Any) -> tuple[ToolResponse, float, dict[str, Any]]:
    """``execute``'s return value checked and normalised: (response, step_reward, metrics) where the
    response is a ToolResponse, a str or a ToolResponse-shaped dict, the reward a finite number (or
    None) and the metrics a JSON object of finite values (or None)."""
    if not isinstance(value, (tuple, list)) or len(value) != 3:
        got = f"a {len(value)}-tuple" if isinstance(value, (tuple, list)) else f"{_kind(value)} {value!r:.80}"
        raise ToolReturnError(f"execute must return (response, step_reward, metrics), got {got}")
    response, step_reward, metrics = value
    if isinstance(response, str):
        response = ToolResponse(text=response)
    elif isinstance(response, Mapping):
        try:
            response = ToolResponse.model_validate(response)
        except ValidationError as exc:
            raise ToolReturnError(f"response: {format_errors(exc)}") from None
    elif not isinstance(response, ToolResponse):
        raise ToolReturnError(f"response must be a str or a ToolResponse, got {_kind(response)} {response!r:.80}")
    try:
        reward = coerce_reward(step_reward, "step_reward")
    except RewardValueError as exc:
        raise ToolReturnError(str(exc)) from None
    if metrics is None:
        metrics = {}
    if not isinstance(metrics, Mapping) or not all(isinstance(k, str) for k in metrics):
        raise ToolReturnError(f"metrics must be a dict with str keys, got {_kind(metrics)} {metrics!r:.80}")
    try:
        json.dumps(metrics, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ToolReturnError(f"metrics must hold JSON values and finite numbers: {exc}") from None
    return response, reward, dict(metrics)


def describe_argument_errors(validator: Any, arguments: Any) -> str | None:
    """Check ``arguments`` with a JSON Schema validator; None when valid, else a message naming each field."""
    errors = sorted(validator.iter_errors(arguments), key=lambda e: list(e.absolute_path))
    if not errors:
        return None
    messages = []
    for err in errors:
        where = ".".join(str(p) for p in err.absolute_path)
        if err.validator == "required":
            missing = err.message.split("'")[1] if "'" in err.message else err.message
            field = f"{where}.{missing}" if where else missing
            messages.append(f"missing required field '{field}'")
        elif err.validator == "additionalProperties":
            extra = sorted(set((err.instance or {}).keys()) - set(err.schema.get("properties", {})))
            names = ", ".join(f"'{f}'" for f in extra) or err.message
            messages.append(f"unexpected field {names}" + (f" in '{where}'" if where else ""))
        else:
            messages.append(f"field '{where or '(arguments)'}': {err.message}")
    return "; ".join(messages)


def _seconds(value: Any, tool: str) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if not (seconds > 0 and math.isfinite(seconds)) or isinstance(value, bool):
        raise ToolConfigError(f"invalid config for tool {tool}: config.timeout: expected a positive number of "
                              f"seconds, got {value!r}")
    return seconds


class Tool:
    """Base class for tools. Subclasses set ``schema`` (an OpenAI function schema) and implement
    ``execute``; they may set ``config_model`` (a pydantic model, validated with field names in
    errors) and override the other lifecycle methods. State for one trajectory lives in
    ``self.state(instance_id)``, never in globals, so concurrent trajectories stay isolated."""

    schema: ClassVar[dict[str, Any] | None] = None
    config_model: ClassVar[type[BaseModel] | None] = None
    default_timeout: ClassVar[float] = 30.0
    runs_isolated: ClassVar[bool] = False  # True for the parent's handle on an isolated tool

    def __init__(self, config: Mapping[str, Any] | None = None, tool_schema: ToolSchema | Mapping | None = None):
        self.timeout, self.isolation, self.config = self.checked_config(config)
        if self.isolation == "process" and not self.runs_isolated:
            raise ToolConfigError(f"config.isolation: process is not supported by {type(self).__name__} built "
                                  "in this process: a tool config (toolrl.tools.verl_config) builds it in a "
                                  "worker process")
        schema = tool_schema if tool_schema is not None else self.schema
        if schema is None:
            raise ToolConfigError(f"tool {type(self).__name__} has no schema: set `schema` or pass tool_schema")
        try:
            self.tool_schema = ToolSchema.model_validate(schema)
        except ValidationError as exc:
            raise ToolConfigError(
                f"invalid tool_schema for {type(self).__name__}: {format_errors(exc, 'tool_schema')}"
            ) from None
        self.name = self.tool_schema.function.name
        self._instances: dict[str, dict[str, Any]] = {}
        self._validator: Any = None

    @classmethod
    def checked_config(cls, config: Mapping[str, Any] | None) -> tuple[float, Isolation, Any]:
        """``config`` checked as the constructor checks it, without building a tool (the run check checks
        every tool entry so, before anything starts): its ``timeout`` and ``isolation``, and the rest
        validated against ``config_model`` (kept as a dict for a tool that declares none). A bad key or
        value is a :class:`ToolConfigError` naming it."""
        raw = dict(config or {})
        timeout = _seconds(raw.get("timeout", cls.default_timeout), cls.__name__)
        isolation = raw.get("isolation", "none")
        if isolation not in ("none", "process"):
            raise ToolConfigError(f"invalid config for tool {cls.__name__}: config.isolation: "
                                  f"expected 'none' or 'process', got {isolation!r}")
        options = {k: v for k, v in raw.items() if k not in BASE_CONFIG_KEYS}
        if cls.config_model is None:
            return timeout, isolation, options
        try:
            return timeout, isolation, cls.config_model.model_validate(options)
        except ValidationError as exc:
            raise ToolConfigError(f"invalid config for tool {cls.__name__}: {format_errors(exc, 'config')}") from None

    @classmethod
    def check_entry(cls, config: Mapping[str, Any], section: Mapping[str, Any]) -> None:
        """The run check of one tool-config entry naming this class, before any tool is built or started:
        ``config`` as the constructor checks it (:meth:`checked_config`). A tool that reads a block of its
        own from the entry (``section``, a :class:`toolrl.tools.verl_config.ToolSection`) extends this to
        check that too (the files it names exist and parse), starting nothing. Raises ToolConfigError."""
        cls.checked_config(config)

    # The build contract (toolrl.plugins.parts): a tool's config passes whole to the tool, which checks
    # it against its ``config_model`` field by field.
    Options: ClassVar[type[BaseModel]] = UncheckedOptions

    @classmethod
    async def build(cls, options: BaseModel, context: Any) -> list[Tool]:
        """The tools one config entry stands for (:meth:`from_config`), from its config (``options``),
        its ``tool_schema`` and the whole entry (``section``) in ``context.inputs``."""
        return await cls.from_config(options.model_dump(), context.input("tool_schema"), context.input("section"))

    @classmethod
    async def from_config(
        cls, config: Mapping[str, Any], tool_schema: Mapping | None, section: Mapping[str, Any]
    ) -> list[Tool]:
        """Build the tools one tool-config entry stands for. ``section`` is the whole entry, a
        :class:`toolrl.tools.verl_config.ToolSection` (a mapping with ``base_dir``): a tool reads its own
        sibling blocks from it (the MCP plugin reads ``mcp:``). Most tools are one tool per entry.
        Not called for ``isolation: process``: the tool is then built in a worker process
        (:meth:`toolrl.tools.isolation.ProcessTool.start`), which only this default allows."""
        return [cls(config, tool_schema)]

    # -- lifecycle ------------------------------------------------------------------------------

    async def create(self, instance_id: str | None = None, **create_kwargs: Any) -> str:
        """Start a trajectory's instance. The default keeps ``create_kwargs`` (e.g. ground truth)
        as the instance's state."""
        instance_id = instance_id or uuid.uuid4().hex
        self._instances[instance_id] = dict(create_kwargs)
        return instance_id

    async def execute(
        self, instance_id: str, arguments: dict[str, Any], **execute_kwargs: Any
    ) -> tuple[ToolResponse | str, float, dict[str, Any]]:
        """Run one call: returns (response, step reward, metrics)."""
        raise NotImplementedError

    async def calc_reward(self, instance_id: str, **calc_reward_kwargs: Any) -> float | Mapping[str, float] | None:
        """The tool's final reward for the trajectory: a number, or named parts
        (:func:`toolrl.rewards.scoring.named_parts`: with ``"reward"``, the parts beside it are reported;
        without it, the parts sum to the reward); None: no reward (not a 0)."""
        return 0.0

    async def release(self, instance_id: str, **release_kwargs: Any) -> None:
        """Free the instance's state and resources."""
        self._instances.pop(instance_id, None)

    async def clone(self, instance_id: str, new_instance_id: str) -> str:
        """Start ``new_instance_id`` in ``instance_id``'s state, the two independent from then on (a
        tree rollout's continuations, toolrl.rollout.tree); both are released. The default deep-copies
        the instance's state, all the default lifecycle keeps; a tool whose state lives elsewhere (a
        server, a sandbox, a worker process) overrides it, or cannot clone (:meth:`can_clone`)."""
        self._instances[new_instance_id] = copy.deepcopy(self.state(instance_id))
        return new_instance_id

    @classmethod
    def can_clone(cls) -> bool:
        """Whether a trajectory's instance can clone: the tool overrides :meth:`clone`, or keeps its
        instance state where the default lifecycle does (``create`` and ``release`` its own)."""
        return cls.clone is not Tool.clone or (cls.create is Tool.create and cls.release is Tool.release)

    async def close(self) -> None:
        """Free process-wide resources (sessions, pools) when the tool is no longer used."""

    def state(self, instance_id: str) -> dict[str, Any]:
        try:
            return self._instances[instance_id]
        except KeyError:
            raise KeyError(f"tool {self.name!r} has no instance {instance_id!r}: call create() first") from None

    # -- the guarded call path --------------------------------------------------------------------

    def validate_arguments(self, arguments: Any) -> str | None:
        if not isinstance(arguments, dict):
            return f"arguments must be a JSON object, got {type(arguments).__name__}"
        if self._validator is None:
            from jsonschema import Draft202012Validator  # lazy: about 1 s to import; only calls need it

            self._validator = Draft202012Validator(self.tool_schema.function.parameters)
        return describe_argument_errors(self._validator, arguments)

    async def call(self, instance_id: str, arguments: Any, **execute_kwargs: Any) -> ToolResult:
        """Validate, execute under the per-call deadline and check the return value; never raises:
        every failure becomes an error response the model can read."""
        start = time.perf_counter()
        args = arguments if isinstance(arguments, dict) else {}
        outcome = Guarded()

        def result(response: ToolResponse, status: str, step_reward: float = 0.0, metrics=None) -> ToolResult:
            return ToolResult(
                name=self.name,
                arguments=args,
                response=response,
                step_reward=step_reward,
                metrics=metrics or {},
                status=status,  # type: ignore[arg-type]
                latency_s=time.perf_counter() - start,
                loop_blocked_s=outcome.blocked_s,
            )

        problem = self.validate_arguments(arguments)
        if problem is not None:
            return result(ToolResponse.error(f"Error: invalid arguments for tool '{self.name}': {problem}"),
                          "invalid_arguments")
        outcome = await run_guarded(f"tool {self.name!r} execute", self.execute, (instance_id, args), execute_kwargs,
                                self.timeout)
        if outcome.timed_out:
            held = f" (it held the event loop for {outcome.blocked_s:.1f} s)" if outcome.blocked_s else ""
            return result(ToolResponse.error(f"Error: tool '{self.name}' timed out after {self.timeout:g} s{held}"),
                          "timeout")
        if outcome.error is not None:
            return result(ToolResponse.error(f"Error executing tool '{self.name}': {outcome.error}"),
                          "infra_error" if outcome.infrastructure else "error")
        try:
            response, step_reward, metrics = coerce_execute_result(outcome.value)
        except ToolReturnError as exc:
            return result(ToolResponse.error(f"Error: tool '{self.name}' returned an invalid result: {exc}"), "error")
        return result(response, "error" if response.is_error else "ok", step_reward, metrics)


def trajectory_of(instance_id: str) -> str:
    """The trajectory an instance belongs to. :class:`ToolSet` names each instance
    ``"<trajectory id>:<tool name>"`` (tool names hold no colon), so that tools sharing per-trajectory
    state (one environment session, one database copy) find it from their own instance ids, e.g. in a
    :class:`SharedResources`."""
    return instance_id.rsplit(":", 1)[0]


class ToolSet:
    """The tools of one trajectory: creates every instance at the start, routes calls by name, and
    always finishes with calc_reward and release."""

    def __init__(
        self,
        tools: Mapping[str, Tool],
        tools_kwargs: Mapping[str, ToolKwargs | Mapping] | None = None,
        trajectory_id: str | None = None,
        lifecycle_timeout: float = 60.0,
    ):
        self.tools = dict(tools)
        self.kwargs = {n: ToolKwargs.model_validate(k) for n, k in (tools_kwargs or {}).items()}
        self.trajectory_id = trajectory_id or uuid.uuid4().hex
        self.lifecycle_timeout = lifecycle_timeout
        self.instances: dict[str, str] = {}
        self.create_errors: dict[str, str] = {}
        self.finish_errors: dict[str, str] = {}
        # The first lifecycle stage that failed with InfrastructureError ("tool 'x' create: ..."), if any.
        self.infrastructure: str | None = None
        self.reward_parts: dict[str, float] = {}  # "tool.part" -> value, from calc_reward mappings
        self.loop_blocked_s = 0.0  # seconds tool code held the event loop in this trajectory, all stages

    def _kwargs(self, name: str) -> ToolKwargs:
        return self.kwargs.get(name) or ToolKwargs()

    def schemas(self) -> list[dict[str, Any]]:
        return [t.tool_schema.model_dump(exclude_none=True) for t in self.tools.values()]

    async def _stage(self, name: str, method: str, *args: Any, **kwargs: Any) -> tuple[Guarded, str | None]:
        """One lifecycle method of tool ``name`` under the lifecycle deadline: its outcome, and what went
        wrong (None when nothing did)."""
        tool = self.tools[name]
        outcome = await run_guarded(f"tool {name!r} {method}", getattr(tool, method), args, kwargs,
                                self.lifecycle_timeout)
        self.loop_blocked_s += outcome.blocked_s
        if outcome.infrastructure and self.infrastructure is None:
            self.infrastructure = f"tool {name!r} {method}: {outcome.error}"
        if outcome.timed_out:
            return outcome, f"timed out after {self.lifecycle_timeout:g} s"
        return outcome, outcome.error

    async def start(self) -> None:
        async def create(name: str) -> None:
            outcome, problem = await self._stage(name, "create", f"{self.trajectory_id}:{name}",
                                                 **self._kwargs(name).create_kwargs)
            if problem is None and not isinstance(outcome.value, str):
                problem = f"create must return the instance id (a str), got {type(outcome.value).__name__}"
            if problem is None:
                self.instances[name] = outcome.value
            else:
                self.create_errors[name] = problem

        await asyncio.gather(*(create(n) for n in self.tools))

    async def clone(self, trajectory_id: str, tools: Mapping[str, Tool]) -> ToolSet:
        """The tools of a continuation ``trajectory_id`` of this trajectory (toolrl.rollout.tree):
        ``tools``, each instance cloned by the tool that holds it here. ``tools`` are these, but for
        tools that keep no instance state (a session's tool, bound to the continuation's cloned
        session). A tool that cannot clone (:meth:`Tool.can_clone`) or whose clone fails is unavailable
        there, as one whose create failed."""
        twin = ToolSet(tools, self.kwargs, trajectory_id, self.lifecycle_timeout)
        twin.create_errors, twin.infrastructure = dict(self.create_errors), self.infrastructure

        async def clone(name: str, iid: str) -> None:
            if not type(self.tools[name]).can_clone():
                twin.create_errors[name] = "clone: the tool cannot clone its state (Tool.clone)"
                return
            outcome, problem = await self._stage(name, "clone", iid, f"{trajectory_id}:{name}")
            if problem is None and isinstance(outcome.value, str):
                twin.instances[name] = outcome.value
            else:
                twin.create_errors[name] = f"clone: {problem or 'clone must return the instance id (a str)'}"
        await asyncio.gather(*(clone(n, i) for n, i in self.instances.items()))
        return twin

    def check_infrastructure(self) -> None:
        """Raise :class:`InfrastructureError` when a lifecycle stage failed with one."""
        if self.infrastructure is not None:
            raise InfrastructureError(self.infrastructure)

    async def call(self, call: ToolCall) -> ToolResult:
        tool = self.tools.get(call.name)
        if tool is None:
            available = ", ".join(sorted(self.tools)) or "none"
            return ToolResult(
                name=call.name, arguments=call.arguments, status="unknown_tool",
                response=ToolResponse.error(f"Error: unknown tool '{call.name}'. Available tools: {available}"),
            )
        if call.name not in self.instances:
            why = self.create_errors.get(call.name, "not started")
            return ToolResult(name=call.name, arguments=call.arguments, status="error",
                              response=ToolResponse.error(f"Error: tool '{call.name}' is unavailable: {why}"))
        result = await tool.call(self.instances[call.name], call.arguments, **self._kwargs(call.name).execute_kwargs)
        self.loop_blocked_s += result.loop_blocked_s
        return result

    async def finish(self) -> dict[str, float]:
        """calc_reward then release for every created instance; never raises. A calc_reward that fails
        or returns anything but a finite number (or a mapping of them) is recorded in ``finish_errors`` and gives no reward."""

        async def finish_one(name: str, iid: str) -> tuple[str, float | None]:
            kw = self._kwargs(name)
            reward: float | None = None
            try:
                outcome, problem = await self._stage(name, "calc_reward", iid, **kw.calc_reward_kwargs)
                if problem is None and outcome.value is not None:  # None: the tool gives no reward
                    try:
                        reward, parts, _ = named_parts(outcome.value, "calc_reward")
                        self.reward_parts.update({f"{name}.{k}": v for k, v in parts.items()})
                    except RewardValueError as exc:
                        problem = str(exc)
                if problem is not None:
                    self.finish_errors[name] = f"calc_reward: {problem}"
            finally:
                _, problem = await self._stage(name, "release", iid, **kw.release_kwargs)
                if problem is not None:
                    self.finish_errors[name] = "; ".join(
                        filter(None, [self.finish_errors.get(name), f"release: {problem}"]))
            return name, reward

        done = await asyncio.gather(*(finish_one(n, i) for n, i in self.instances.items()))
        self.instances.clear()
        return {name: reward for name, reward in done if reward is not None}
