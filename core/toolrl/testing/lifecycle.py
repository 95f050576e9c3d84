"""Recording a tool's lifecycle calls and running one whole lifecycle, as a rollout does."""

from __future__ import annotations

import contextvars
import functools
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from toolrl.schemas import ToolCall, ToolKwargs, ToolResult
from toolrl.tools import Tool, ToolSet

LIFECYCLE = ("create", "execute", "calc_reward", "release")

# The lifecycle method running in the current task; nested calls record it as their caller.
_running: contextvars.ContextVar[str | None] = contextvars.ContextVar("toolrl_testing_running", default=None)


@dataclass
class LifecycleCall:
    """One call of a lifecycle method. ``caller`` is the lifecycle method that was running when this
    one started (the tool called it itself), or None when the driver (a rollout, the kit) called it."""

    method: str
    instance_id: str | None
    caller: str | None = None

    def __str__(self) -> str:
        where = f" (called from inside {self.caller})" if self.caller else ""
        return f"{self.method}({self.instance_id!r}){where}"


@dataclass
class CallRecorder:
    """Every lifecycle call made on one instrumented tool, in the order they started."""

    calls: list[LifecycleCall] = field(default_factory=list)


def instrument(tool: Tool) -> CallRecorder:
    """Wrap ``tool``'s lifecycle methods (on this object only) so each call is recorded, including
    calls a tool makes to its own lifecycle methods. Calling it again returns the same recorder."""
    existing = tool.__dict__.get("_toolrl_recorder")
    if existing is not None:
        return existing
    recorder = CallRecorder()
    for method in LIFECYCLE:
        original = getattr(tool, method)

        def begin(args: tuple[Any, ...], kwargs: dict[str, Any], method: str) -> tuple[LifecycleCall, Any]:
            call = LifecycleCall(method, args[0] if args else kwargs.get("instance_id"), _running.get())
            recorder.calls.append(call)
            return call, _running.set(method)

        def end(call: LifecycleCall, result: Any) -> Any:
            if call.method == "create" and call.instance_id is None and isinstance(result, str):
                call.instance_id = result
            return result

        if inspect.iscoroutinefunction(original):
            @functools.wraps(original)
            async def recorded(*args: Any, _method: str = method, _original: Any = original, **kwargs: Any) -> Any:
                call, token = begin(args, kwargs, _method)
                try:
                    result = await _original(*args, **kwargs)
                finally:
                    _running.reset(token)
                return end(call, result)
        else:  # a plain def stays one, so it still runs in a thread
            @functools.wraps(original)
            def recorded(*args: Any, _method: str = method, _original: Any = original, **kwargs: Any) -> Any:
                call, token = begin(args, kwargs, _method)
                try:
                    result = _original(*args, **kwargs)
                finally:
                    _running.reset(token)
                return end(call, result)

        setattr(tool, method, recorded)
    tool.__dict__["_toolrl_recorder"] = recorder
    return recorder


class LifecycleError(RuntimeError):
    """A lifecycle stage failed. ``stage`` names it; ``detail`` says how (ToolSet's words: an exception, a
    timeout, a return value its contract does not allow)."""

    def __init__(self, stage: str, detail: str):
        super().__init__(f"{stage} failed: {detail}")
        self.stage = stage


@dataclass
class LifecycleRun:
    """The outcome of :func:`run_lifecycle`."""

    instance_id: str
    result: ToolResult
    reward: float | None  # calc_reward's value, checked to be a finite number; None: the tool gives none
    calls: list[LifecycleCall]
    loop_blocked_s: float = 0.0  # seconds the tool's code held the event loop, all stages

    @property
    def order(self) -> list[str]:
        """The lifecycle methods in the order they started, nested calls included."""
        return [c.method for c in self.calls]


async def run_lifecycle(
    tool: Tool,
    arguments: Any,
    *,
    create_kwargs: Mapping[str, Any] | None = None,
    execute_kwargs: Mapping[str, Any] | None = None,
    calc_reward_kwargs: Mapping[str, Any] | None = None,
    release_kwargs: Mapping[str, Any] | None = None,
    trajectory_id: str | None = None,
    lifecycle_timeout: float = 60.0,
) -> LifecycleRun:
    """Run ``create -> call(arguments) -> calc_reward -> release`` on ``tool`` exactly as a rollout does
    (through :class:`toolrl.tools.ToolSet`: argument validation, deadlines, checks of return values,
    calc_reward/release always) and record every lifecycle call. A failed stage (create, calc_reward
    or release) surfaces as :class:`LifecycleError`; a failed call is the result's status."""
    recorder = instrument(tool)
    start = len(recorder.calls)
    kwargs = ToolKwargs(create_kwargs=dict(create_kwargs or {}), execute_kwargs=dict(execute_kwargs or {}),
                        calc_reward_kwargs=dict(calc_reward_kwargs or {}),
                        release_kwargs=dict(release_kwargs or {}))
    toolset = ToolSet({tool.name: tool}, {tool.name: kwargs}, trajectory_id, lifecycle_timeout=lifecycle_timeout)
    await toolset.start()
    if tool.name in toolset.create_errors:
        raise LifecycleError("create", toolset.create_errors[tool.name])
    iid = toolset.instances[tool.name]
    try:  # model_construct: a non-object goes to the tool's argument check, as a model's would
        result = await toolset.call(ToolCall.model_construct(name=tool.name, arguments=arguments))
    finally:
        rewards = await toolset.finish()
    if tool.name in toolset.finish_errors:
        stage, _, detail = toolset.finish_errors[tool.name].partition(": ")
        raise LifecycleError(stage, detail)
    return LifecycleRun(instance_id=iid, result=result, reward=rewards.get(tool.name), calls=recorder.calls[start:],
                        loop_blocked_s=toolset.loop_blocked_s)
