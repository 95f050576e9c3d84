"""The Tool base class (per-trajectory lifecycle) and ToolSet (the tools of one trajectory).

Lifecycle, per trajectory (``instance_id``)::

    create(instance_id, **create_kwargs)            once, at trajectory start
    execute(instance_id, arguments, **execute_kwargs) -> (response, step_reward, metrics)   0..n
    calc_reward(instance_id, **calc_reward_kwargs) -> float                                 once
    release(instance_id, **release_kwargs)           once, always (also after errors/timeouts)

Rollouts never call ``execute`` directly: they call :meth:`Tool.call`, which validates the arguments
against the tool's JSON Schema, applies the per-call timeout and turns every failure into an error
response for the model.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import BaseModel, ValidationError

from toolrl.schemas import ToolCall, ToolKwargs, ToolResponse, ToolResult, ToolSchema

# Keys every tool config may carry, handled here rather than by the tool's config model.
BASE_CONFIG_KEYS = ("type", "timeout")


class ToolConfigError(ValueError):
    """A tool config that does not validate; the message names the field."""


def format_validation_error(exc: ValidationError, prefix: str = "") -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        parts.append(f"{prefix}{loc}: {err['msg']}")
    return "; ".join(parts)


def describe_argument_errors(schema: dict[str, Any] | Any, arguments: Any) -> str | None:
    """Check ``arguments`` against a JSON Schema (or a compiled validator); None when valid, else a
    message naming each field."""
    from jsonschema import Draft202012Validator

    validator = Draft202012Validator(schema) if isinstance(schema, dict) else schema
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


class Tool:
    """Base class for tools. Subclasses set ``schema`` (an OpenAI function schema) and implement
    ``execute``; they may set ``config_model`` (a pydantic model, validated with field names in
    errors) and override the other lifecycle methods. State for one trajectory lives in
    ``self.state(instance_id)``, never in globals, so concurrent trajectories stay isolated."""

    schema: ClassVar[dict[str, Any] | None] = None
    config_model: ClassVar[type[BaseModel] | None] = None
    default_timeout: ClassVar[float] = 30.0

    def __init__(self, config: Mapping[str, Any] | None = None, tool_schema: ToolSchema | Mapping | None = None):
        raw = dict(config or {})
        self.timeout = float(raw.get("timeout", self.default_timeout))
        options = {k: v for k, v in raw.items() if k not in BASE_CONFIG_KEYS}
        if self.config_model is not None:
            try:
                self.config: Any = self.config_model.model_validate(options)
            except ValidationError as exc:
                raise ToolConfigError(
                    f"invalid config for tool {type(self).__name__}: {format_validation_error(exc, 'config.')}"
                ) from None
        else:
            self.config = options
        schema = tool_schema if tool_schema is not None else self.schema
        if schema is None:
            raise ToolConfigError(f"tool {type(self).__name__} has no schema: set `schema` or pass tool_schema")
        try:
            self.tool_schema = ToolSchema.model_validate(schema)
        except ValidationError as exc:
            raise ToolConfigError(
                f"invalid tool_schema for {type(self).__name__}: {format_validation_error(exc, 'tool_schema.')}"
            ) from None
        self.name = self.tool_schema.function.name
        self._instances: dict[str, dict[str, Any]] = {}
        self._validator: Any = None

    @classmethod
    async def from_config(
        cls, config: Mapping[str, Any], tool_schema: Mapping | None, section: Mapping[str, Any]
    ) -> list[Tool]:
        """Build the tools one tool-config entry stands for. ``section`` is the whole entry, a
        :class:`toolrl.toolconfig.ToolSection` (a mapping with ``base_dir``): a tool reads its own
        sibling blocks from it (the MCP plugin reads ``mcp:``). Most tools are one tool per entry."""
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

    async def calc_reward(self, instance_id: str, **calc_reward_kwargs: Any) -> float:
        """The tool's final reward for the trajectory."""
        return 0.0

    async def release(self, instance_id: str, **release_kwargs: Any) -> None:
        """Free the instance's state and resources."""
        self._instances.pop(instance_id, None)

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
            from jsonschema import Draft202012Validator

            self._validator = Draft202012Validator(self.tool_schema.function.parameters)
        return describe_argument_errors(self._validator, arguments)

    async def call(self, instance_id: str, arguments: Any, **execute_kwargs: Any) -> ToolResult:
        """Validate, execute with the per-call timeout, and never raise: failures become error
        responses the model can read."""
        start = time.perf_counter()
        args = arguments if isinstance(arguments, dict) else {}

        def result(response: ToolResponse, status: str, step_reward: float = 0.0, metrics=None) -> ToolResult:
            return ToolResult(
                name=self.name,
                arguments=args,
                response=response,
                step_reward=step_reward,
                metrics=metrics or {},
                status=status,  # type: ignore[arg-type]
                latency_s=time.perf_counter() - start,
            )

        problem = self.validate_arguments(arguments)
        if problem is not None:
            return result(ToolResponse.error(f"Error: invalid arguments for tool '{self.name}': {problem}"),
                          "invalid_arguments")
        try:
            response, step_reward, metrics = await asyncio.wait_for(
                self.execute(instance_id, args, **execute_kwargs), timeout=self.timeout
            )
        except asyncio.TimeoutError:
            return result(ToolResponse.error(f"Error: tool '{self.name}' timed out after {self.timeout:g} s"),
                          "timeout")
        except Exception as exc:
            return result(ToolResponse.error(f"Error executing tool '{self.name}': {type(exc).__name__}: {exc}"),
                          "error")
        if isinstance(response, str):
            response = ToolResponse(text=response)
        elif not isinstance(response, ToolResponse):
            response = ToolResponse.model_validate(response)
        return result(response, "error" if response.is_error else "ok", float(step_reward or 0.0), metrics)


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

    def _kwargs(self, name: str) -> ToolKwargs:
        return self.kwargs.get(name) or ToolKwargs()

    def schemas(self) -> list[dict[str, Any]]:
        return [t.tool_schema.model_dump(exclude_none=True) for t in self.tools.values()]

    async def start(self) -> None:
        async def create(name: str, tool: Tool) -> None:
            try:
                iid = await asyncio.wait_for(
                    tool.create(f"{self.trajectory_id}:{name}", **self._kwargs(name).create_kwargs),
                    self.lifecycle_timeout,
                )
                self.instances[name] = iid
            except Exception as exc:
                self.create_errors[name] = f"{type(exc).__name__}: {exc}"

        await asyncio.gather(*(create(n, t) for n, t in self.tools.items()))

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
        return await tool.call(self.instances[call.name], call.arguments, **self._kwargs(call.name).execute_kwargs)

    async def finish(self) -> dict[str, float]:
        """calc_reward then release for every created instance; never raises."""

        async def finish_one(name: str, iid: str) -> tuple[str, float]:
            tool, kw = self.tools[name], self._kwargs(name)
            reward = 0.0
            try:
                reward = float(await asyncio.wait_for(tool.calc_reward(iid, **kw.calc_reward_kwargs),
                                                      self.lifecycle_timeout))
            except Exception as exc:
                self.finish_errors[name] = f"calc_reward: {type(exc).__name__}: {exc}"
            finally:
                try:
                    await asyncio.wait_for(tool.release(iid, **kw.release_kwargs), self.lifecycle_timeout)
                except Exception as exc:
                    self.finish_errors[name] = f"release: {type(exc).__name__}: {exc}"
            return name, reward

        done = await asyncio.gather(*(finish_one(n, i) for n, i in self.instances.items()))
        self.instances.clear()
        return dict(done)
