"""Recording a tool's lifecycle calls and running one whole lifecycle, as a rollout does."""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from toolrl.schemas import ToolResult
from toolrl.tools import Tool

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

    def for_instance(self, instance_id: str) -> list[LifecycleCall]:
        return [c for c in self.calls if c.instance_id == instance_id]


def instrument(tool: Tool) -> CallRecorder:
    """Wrap ``tool``'s lifecycle methods (on this object only) so each call is recorded, including
    calls a tool makes to its own lifecycle methods. Calling it again returns the same recorder."""
    existing = tool.__dict__.get("_toolrl_recorder")
    if existing is not None:
        return existing
    recorder = CallRecorder()
    for method in LIFECYCLE:
        original = getattr(tool, method)

        @functools.wraps(original)
        async def recorded(
            *args: Any, _method: str = method, _original: Any = original, **kwargs: Any
        ) -> Any:
            instance_id = args[0] if args else kwargs.get("instance_id")
            call = LifecycleCall(_method, instance_id, _running.get())
            recorder.calls.append(call)
            token = _running.set(_method)
            try:
                result = await _original(*args, **kwargs)
            finally:
                _running.reset(token)
            if _method == "create" and call.instance_id is None and isinstance(result, str):
                call.instance_id = result
            return result

        setattr(tool, method, recorded)
    tool.__dict__["_toolrl_recorder"] = recorder
    return recorder


class LifecycleError(RuntimeError):
    """A lifecycle method raised. ``stage`` names it; the original exception is ``__cause__``."""

    def __init__(self, stage: str, exc: BaseException):
        super().__init__(f"{stage} raised {type(exc).__name__}: {exc}")
        self.stage = stage


@dataclass
class LifecycleRun:
    """The outcome of :func:`run_lifecycle`."""

    instance_id: str
    result: ToolResult
    reward: Any  # what calc_reward returned (checked to be a float by the conformance checks)
    calls: list[LifecycleCall]

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
    instance_id: str | None = None,
) -> LifecycleRun:
    """Run ``create -> call(arguments) -> calc_reward -> release`` on ``tool`` as a rollout does (the call
    goes through :meth:`Tool.call`: validation, timeout, errors as responses) and record every
    lifecycle call. ``release`` runs even when ``calc_reward`` raises. A raising stage surfaces as
    :class:`LifecycleError`."""
    recorder = instrument(tool)
    start = len(recorder.calls)
    try:
        iid = await tool.create(instance_id, **dict(create_kwargs or {}))
    except Exception as exc:
        raise LifecycleError("create", exc) from exc
    try:
        result = await tool.call(iid, arguments, **dict(execute_kwargs or {}))
    except Exception as exc:  # Tool.call must never raise; report it as such
        raise LifecycleError("call", exc) from exc
    stage = "calc_reward"
    try:
        reward = await tool.calc_reward(iid, **dict(calc_reward_kwargs or {}))
        stage = "release"
    except Exception as exc:
        raise LifecycleError(stage, exc) from exc
    finally:
        try:
            await tool.release(iid, **dict(release_kwargs or {}))
        except Exception as exc:
            if stage == "release":
                raise LifecycleError("release", exc) from exc
    return LifecycleRun(instance_id=iid, result=result, reward=reward, calls=recorder.calls[start:])
