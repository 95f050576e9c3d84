"""The conformance checks. Each is an async function that raises ``AssertionError`` with a message
saying what the tool did and what to change; :class:`toolrl.testing.ToolConformance` runs them all."""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, NoReturn

from toolrl.config import ConfigError
from toolrl.plugins import get_plugins
from toolrl.plugins.parts import lookup_part, registered_part
from toolrl.schemas import ToolCall, ToolKwargs, ToolResult, ToolSchema
from toolrl.testing.lifecycle import LifecycleCall, LifecycleError, LifecycleRun, run_lifecycle
from toolrl.tools import Tool, ToolReturnError, ToolSet, coerce_execute_result
from toolrl.tools.guard import Guarded, run_guarded
from toolrl.tools.verl_config import build_default_tool, build_entry, load_tools_file

if TYPE_CHECKING:
    from toolrl.plugins import Plugins

ToolFactory = Callable[[], Awaitable[Tool]]

# OpenAI's function-name rule; toolrl's own schema model is more lenient (dots, 128 characters).
OPENAI_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
UNKNOWN_INSTANCE = "toolrl-testing-never-created"


def _fail(message: str) -> NoReturn:
    raise AssertionError(message)


def _describe(result: ToolResult) -> str:
    return f"status={result.status!r}, text={result.response.text!r}"


def _call(tool: Tool, arguments: Any) -> ToolCall:
    # model_construct: a non-object reaches the tool's argument check, as a model's would
    return ToolCall.model_construct(name=tool.name, arguments=arguments)


async def _trajectory(tool: Tool, create_kwargs: Mapping[str, Any] | None, execute_kwargs: Mapping[str, Any] | None,
                      trajectory_id: str | None = None) -> ToolSet:
    """A started trajectory of ``tool``, driven by :class:`ToolSet` exactly as a rollout drives it."""
    kwargs = ToolKwargs(create_kwargs=dict(create_kwargs or {}), execute_kwargs=dict(execute_kwargs or {}))
    toolset = ToolSet({tool.name: tool}, {tool.name: kwargs}, trajectory_id)
    await toolset.start()
    if tool.name in toolset.create_errors:
        _fail(f"tool {tool.name!r}: create failed: {toolset.create_errors[tool.name]} "
              f"(create_kwargs={dict(create_kwargs or {})!r})")
    return toolset


@asynccontextmanager
async def _started(tool: Tool, create_kwargs: Mapping[str, Any] | None, execute_kwargs: Mapping[str, Any] | None,
                   when: str) -> AsyncIterator[tuple[ToolSet, str]]:
    """What most checks open with: a started trajectory of ``tool`` and its instance id, finished
    (calc_reward, release) on the way out; a failed finish fails the check ``when``, unless the check
    failed first (its own message is the one to read)."""
    toolset = await _trajectory(tool, create_kwargs, execute_kwargs)
    try:
        yield toolset, toolset.instances[tool.name]
    except BaseException:
        await toolset.finish()
        raise
    await _finish(toolset, tool, when)


async def _finish(toolset: ToolSet, tool: Tool, when: str) -> float:
    """calc_reward and release through the ToolSet; their failures fail the check."""
    rewards = await toolset.finish()
    if tool.name in toolset.finish_errors:
        _fail(f"tool {tool.name!r}: {when}: {toolset.finish_errors[tool.name]}")
    return rewards[tool.name]


# -- building and registration ------------------------------------------------------------------


def check_registered(name: str, plugins: Plugins | None = None) -> None:
    """``name`` (a tool name, alias or tools-config ``class_name``) resolves through the plugin registry
    to a :class:`toolrl.tools.Tool` subclass, registered by a plugin whose status is ok. ``plugins``
    defaults to the process-wide ones (what tool configs and the CLI use)."""
    plugins = plugins if plugins is not None else get_plugins()
    troubled = [
        f"{i.name} ({i.distribution}): {i.status}: {i.error}" for i in plugins.list() if i.status == "error"
    ]
    try:
        part = registered_part("tools", name, "tool", plugins)
    except ConfigError as exc:
        hint = (
            f"{exc}. Check that your plugin is installed (pip install -e plugins/<name>), that its "
            "[project.entry-points.toolrl] entry names a module with a register_tools hook, and that "
            "the hook registers this name (or lists it in aliases=...)."
        )
        if troubled:
            hint += " Plugins that failed to load: " + "; ".join(troubled)
        _fail(hint)
    info = plugins.info[part.plugin]
    if info.status != "ok":
        _fail(f"tool {name!r} is registered by plugin {info.name!r} ({info.distribution}), whose status is "
              f"{info.status!r}: {info.error}. Fix that error: a plugin with errors is not conformant.")
    try:  # the registry checks that what it loads is a Tool subclass
        lookup_part("tools", name, "tool", plugins)
    except ConfigError as exc:
        _fail(f"tool {name!r} (plugin {info.name!r}) is registered as {part.target!r}, which does not import: "
              f"{exc}. A lazy reference must be 'package.module:Attribute'.")


async def build_tool(name: str, config: Mapping[str, Any] | None = None,
                     tools_config_file: str | os.PathLike | None = None) -> tuple[Tool, str]:
    """Build the tool ``name`` and return it with the registry name it came from (what
    :func:`check_registered` should check). Without a file, ``name`` is a registered tool name or alias
    built with ``config``. With a verl-format tools YAML, ``name`` is the function name of one of its
    tools; the other tools it builds are closed."""
    if tools_config_file is None:
        return await build_default_tool(name, config), name
    tools_file = load_tools_file(tools_config_file)
    found: tuple[Tool, str] | None = None
    for entry in tools_file.tools:
        for tool in await build_entry(entry, tools_file.base_dir):
            if tool.name == name and found is None:
                found = (tool, entry.class_name)
            else:
                await tool.close()
    if found is None:
        _fail(f"{tools_config_file} builds no tool whose function name is {name!r}")
    return found


# -- schema -------------------------------------------------------------------------------------


def check_schema(tool: Tool, valid_arguments: Mapping[str, Any]) -> None:
    """The tool's schema is a valid OpenAI function schema and ``valid_arguments`` validate against it."""
    from jsonschema import Draft202012Validator

    dumped = tool.tool_schema.model_dump(exclude_none=True)
    try:
        json.dumps(dumped)
    except (TypeError, ValueError) as exc:
        _fail(f"tool {tool.name!r}: the schema is not JSON-serialisable ({exc}); chat templates receive it as JSON")
    ToolSchema.model_validate(dumped)  # round trip: what a template gets must load again (valid JSON Schema)
    function = tool.tool_schema.function
    if not OPENAI_NAME.match(function.name):
        _fail(f"tool {tool.name!r}: function name {function.name!r} is not a valid OpenAI function name "
              "(letters, digits, '_' and '-', at most 64 characters)")
    if not function.description.strip():
        _fail(f"tool {tool.name!r}: the function has no description; the model reads it to decide when and how "
              "to call the tool. Set schema['function']['description'].")
    params = function.parameters
    if params.get("type") != "object":
        _fail(f'tool {tool.name!r}: parameters must say "type": "object" (OpenAI requires it)')
    properties = params.get("properties", {})
    missing = [r for r in params.get("required", []) if r not in properties]
    if missing:
        _fail(f"tool {tool.name!r}: required lists {missing}, which are not in parameters.properties")
    errors = sorted(
        Draft202012Validator(params).iter_errors(dict(valid_arguments)), key=lambda e: list(e.path)
    )
    if errors:
        detail = "; ".join(f"{'.'.join(map(str, e.path)) or '(arguments)'}: {e.message}" for e in errors)
        _fail(f"tool {tool.name!r}: valid_arguments {dict(valid_arguments)!r} do not validate against the tool's "
              f"parameters: {detail}. Fix valid_arguments or the schema.")


# -- lifecycle ----------------------------------------------------------------------------------


def check_order(calls: Sequence[LifecycleCall], instance_id: str) -> None:
    """The recorded calls of one lifecycle follow ``create -> execute+ -> calc_reward -> release``:
    create first and once, no lifecycle call after release, and create/release only ever called by the
    rollout (a tool that releases or re-creates its own instance loses the trajectory's state)."""
    trace = " -> ".join(str(c) for c in calls) or "(no calls)"
    expected = "create -> execute -> calc_reward -> release"
    if not calls or calls[0].method != "create":
        _fail(f"lifecycle order: expected {expected}; the first call was not create. Recorded: {trace}")
    for call in calls:
        if call.method in ("create", "release") and call.caller is not None:
            _fail(f"lifecycle order: {call.method} was called from inside {call.caller}. Only the rollout creates "
                  f"and releases instances; a tool that does it itself loses or resets the trajectory's state "
                  f"before {expected} is complete. Recorded: {trace}")
        if call.instance_id != instance_id:
            _fail(f"lifecycle order: {call.method} ran on instance {call.instance_id!r}, but create returned "
                  f"{instance_id!r}; every stage must use the id create returned. Recorded: {trace}")
    if sum(c.method == "create" for c in calls) != 1:
        _fail(f"lifecycle order: create ran more than once for one trajectory. Recorded: {trace}")
    outer = [c.method for c in calls if c.caller is None]
    if "execute" not in outer:
        _fail(f"lifecycle order: Tool.call did not run execute (do not override Tool.call; implement execute). "
              f"Recorded: {trace}")
    released = next((i for i, c in enumerate(calls) if c.method == "release"), None)
    if released is None:
        _fail(f"lifecycle order: release never ran. Recorded: {trace}")
    late = [c for c in calls[released:] if c.method != "release"]
    if late:
        _fail(f"lifecycle order: {late[0].method} ran after release; {expected} must end with release. "
              f"Recorded: {trace}")


def check_reward_value(value: Any, tool: Tool, when: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        _fail(f"tool {tool.name!r}: calc_reward {when} returned {value!r} ({type(value).__name__}); it must return "
              "a float (return 0.0 when there is nothing to reward)")
    if not math.isfinite(value):
        _fail(f"tool {tool.name!r}: calc_reward {when} returned {value!r}; rewards must be finite")
    return float(value)


async def check_lifecycle(tool: Tool, arguments: Mapping[str, Any], *,
                          create_kwargs: Mapping[str, Any] | None = None,
                          execute_kwargs: Mapping[str, Any] | None = None,
                          expected_text: str | None = None) -> LifecycleRun:
    """Run one whole lifecycle with valid arguments: it must succeed, in order, and leave no state."""
    try:
        lifecycle = await run_lifecycle(
            tool, dict(arguments), create_kwargs=create_kwargs, execute_kwargs=execute_kwargs
        )
    except LifecycleError as exc:
        _fail(f"tool {tool.name!r}: {exc} (create_kwargs={dict(create_kwargs or {})!r}, "
              f"arguments={dict(arguments)!r}). Lifecycle methods must not raise on valid input.")
    if not isinstance(lifecycle.instance_id, str) or not lifecycle.instance_id:
        _fail(
            f"tool {tool.name!r}: create returned {lifecycle.instance_id!r}; it must return the instance id (a str)"
        )
    if lifecycle.result.status != "ok" or lifecycle.result.response.is_error:
        _fail(f"tool {tool.name!r}: the call with valid_arguments {dict(arguments)!r} failed "
              f"({_describe(lifecycle.result)}). valid_arguments must be a call the tool accepts.")
    check_order(lifecycle.calls, lifecycle.instance_id)
    if expected_text is not None and expected_text not in lifecycle.result.response.text:
        _fail(
            f"tool {tool.name!r}: expected {expected_text!r} in the response, got {lifecycle.result.response.text!r}"
        )
    if lifecycle.instance_id in getattr(tool, "_instances", {}):
        _fail(f"tool {tool.name!r}: release left the instance's state in tool._instances; an overridden release "
              "must call super().release(instance_id) (or pop the state itself)")
    return lifecycle


# -- error paths --------------------------------------------------------------------------------


def derive_invalid_arguments(parameters: Mapping[str, Any],
                             valid_arguments: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Invalid calls implied by the schema: each required field left out, an unexpected field (when
    ``additionalProperties`` is false) and each typed field given a value of the wrong type."""
    properties = parameters.get("properties") or {}
    derived: list[dict[str, Any]] = [{k: v for k, v in valid_arguments.items() if k != name}
                                     for name in parameters.get("required", [])]
    if parameters.get("additionalProperties") is False:
        derived.append({**valid_arguments, "toolrl_unexpected_field": 1})
    wrong_values = {
        "string": 12345,
        "integer": "not a number",
        "number": "not a number",
        "boolean": "not a boolean",
        "array": "not an array",
        "object": "not an object",
    }
    for name, spec in properties.items():
        kind = spec.get("type") if isinstance(spec, dict) else None
        if isinstance(kind, str) and kind in wrong_values and name in valid_arguments:
            derived.append({**valid_arguments, name: wrong_values[kind]})
    return derived


def _names_field(text: str, fields: set[str]) -> bool:
    return any(re.search(rf"(?<![A-Za-z0-9_]){re.escape(f)}(?![A-Za-z0-9_])", text) for f in fields)


async def check_invalid_arguments(tool: Tool, invalid_arguments: Sequence[Mapping[str, Any]],
                                  valid_arguments: Mapping[str, Any], *,
                                  create_kwargs: Mapping[str, Any] | None = None,
                                  execute_kwargs: Mapping[str, Any] | None = None) -> list[ToolResult]:
    """Each invalid call returns an error result that names a field (one of the call's keys or the
    schema's properties) and never raises; afterwards the instance still serves a valid call."""
    properties = set((tool.tool_schema.function.parameters.get("properties") or {}).keys())
    results = []
    async with _started(tool, create_kwargs, execute_kwargs, "after the invalid calls") as (toolset, _):
        for i, args in enumerate(invalid_arguments):
            label = f"invalid_arguments[{i}] = {args!r}"
            try:
                result = await toolset.call(_call(tool, args))
            except Exception as exc:
                _fail(
                    f"tool {tool.name!r}: {label}: Tool.call raised {type(exc).__name__}: {exc}. Calls must never "
                    "raise out of a rollout: invalid input becomes an error response."
                )
            if result.status == "ok" or not result.response.is_error:
                _fail(f"tool {tool.name!r}: {label} was accepted ({_describe(result)}). Tighten the schema "
                      '(required, types, "additionalProperties": false) or return ToolResponse.error(...) from '
                      "execute for input it cannot use.")
            fields = properties | {
                k for k in (args if isinstance(args, Mapping) else ()) if isinstance(k, str)
            }
            if not _names_field(result.response.text, fields):
                _fail(f"tool {tool.name!r}: {label} produced an error that names no field (expected one of "
                      f"{sorted(fields)}): {result.response.text!r}. A model can only fix a call it can locate: "
                      "say which field is wrong, e.g. \"field 'expression': ...\".")
            results.append(result)
        after = await toolset.call(_call(tool, dict(valid_arguments)))
        if after.status != "ok":
            _fail(f"tool {tool.name!r}: after the invalid calls, a valid call on the same instance failed "
                  f"({_describe(after)}); an invalid call must not break the instance")
    return results


async def check_released_and_unknown(tool: Tool, arguments: Mapping[str, Any], *,
                                     create_kwargs: Mapping[str, Any] | None = None,
                                     execute_kwargs: Mapping[str, Any] | None = None) -> None:
    """A call on a released instance or on an id that was never created returns an error result."""
    iid = await tool.create(None, **dict(create_kwargs or {}))
    await tool.release(iid)
    for what, target in (
        ("a released instance", iid),
        ("an instance that was never created", UNKNOWN_INSTANCE),
    ):
        try:
            result = await tool.call(target, dict(arguments), **dict(execute_kwargs or {}))
        except Exception as exc:
            _fail(f"tool {tool.name!r}: a call on {what} raised {type(exc).__name__}: {exc} out of Tool.call")
        if result.status == "ok" or not result.response.is_error:
            _fail(f"tool {tool.name!r}: a call on {what} succeeded ({_describe(result)}). execute must refuse "
                  "instances that do not exist: read state with self.state(instance_id), which raises for them "
                  "(Tool.call turns that into an error response), and drop the state in release.")


async def check_release_idempotent(tool: Tool, arguments: Mapping[str, Any], *,
                                   create_kwargs: Mapping[str, Any] | None = None,
                                   execute_kwargs: Mapping[str, Any] | None = None) -> None:
    """Releasing twice, or releasing an id that was never created, does not raise."""
    iid = await tool.create(None, **dict(create_kwargs or {}))
    await tool.call(iid, dict(arguments), **dict(execute_kwargs or {}))
    await tool.release(iid)
    for what, target in (("twice", iid), ("for an id that was never created", UNKNOWN_INSTANCE)):
        try:
            await tool.release(target)
        except Exception as exc:
            _fail(f"tool {tool.name!r}: release {what} raised {type(exc).__name__}: {exc}. Rollouts release in "
                  "finally blocks, after errors and timeouts too: release must be idempotent "
                  "(e.g. self._instances.pop(instance_id, None)).")


async def check_calc_reward(tool: Tool, arguments: Mapping[str, Any], *,
                            create_kwargs: Mapping[str, Any] | None = None,
                            execute_kwargs: Mapping[str, Any] | None = None) -> tuple[float, float]:
    """calc_reward returns a finite float both when the model never called the tool and after a call."""
    iid = await tool.create(None, **dict(create_kwargs or {}))
    try:
        try:
            before = await tool.calc_reward(iid)
        except Exception as exc:
            _fail(f"tool {tool.name!r}: calc_reward on an instance that was never called raised "
                  f"{type(exc).__name__}: {exc}. Models often never call a tool; return the reward for that case.")
        before = check_reward_value(before, tool, "before any call")
        await tool.call(iid, dict(arguments), **dict(execute_kwargs or {}))
        after = check_reward_value(await tool.calc_reward(iid), tool, "after a call")
    finally:
        await tool.release(iid)
    return before, after


# -- concurrency --------------------------------------------------------------------------------


async def _sequence(toolset: ToolSet, tool: Tool, arguments: Mapping[str, Any]) -> list:
    """Two calls then calc_reward in one trajectory: the observable outcome."""
    outcome: list[Any] = []
    for _ in range(2):
        result = await toolset.call(_call(tool, dict(arguments)))
        outcome.append((result.status, result.response.text, result.step_reward))
    outcome.append(("calc_reward", await _finish(toolset, tool, "finishing a trajectory")))
    return outcome


async def check_isolation(build: ToolFactory, arguments: Mapping[str, Any], *,
                          create_kwargs: Mapping[str, Any] | None = None,
                          other_create_kwargs: Mapping[str, Any] | None = None,
                          execute_kwargs: Mapping[str, Any] | None = None, deterministic: bool = True) -> None:
    """Two trajectories on one tool object do not share state: trajectory A (created with
    ``other_create_kwargs``) and trajectory B (``create_kwargs``) each give the same results side by
    side, run concurrently, as alone on a fresh tool; and B keeps working after A has finished.
    ``build`` makes a fresh tool each time. With ``deterministic=False`` only success is compared."""
    create_kwargs, execute_kwargs = dict(create_kwargs or {}), dict(execute_kwargs or {})
    other = dict(other_create_kwargs if other_create_kwargs is not None else create_kwargs)

    async def alone(kwargs: dict[str, Any]) -> list:
        solo_tool = await build()
        try:
            return await _sequence(await _trajectory(solo_tool, kwargs, execute_kwargs), solo_tool, arguments)
        finally:
            await solo_tool.close()

    solo = {"A": await alone(other), "B": await alone(create_kwargs)}
    tool = await build()
    try:
        a = await _trajectory(tool, other, execute_kwargs, "toolrl-testing-A")
        b = await _trajectory(tool, create_kwargs, execute_kwargs, "toolrl-testing-B")
        together = dict(zip("AB", await asyncio.gather(_sequence(a, tool, arguments), _sequence(b, tool, arguments))))
        for outcome in together.values():
            failed = [o for o in outcome if o[0] not in ("ok", "calc_reward")]
            if failed:
                _fail(
                    f"tool {tool.name!r}: a valid call failed while two trajectories ran concurrently: {failed[0]}"
                )
        for label, kwargs in (("A", other), ("B", create_kwargs)):
            if deterministic and together[label] != solo[label]:
                _fail(
                    f"tool {tool.name!r}: trajectory {label} (create_kwargs={kwargs!r}) gave different results next "
                    f"to the other trajectory than alone on a fresh tool.\n  alone:    {solo[label]}\n  together: "
                    f"{together[label]}\nKeep per-trajectory state in self.state(instance_id) (filled in create), "
                    "never on self or the class. (Set deterministic = False if the tool's output legitimately varies "
                    "between identical calls.)"
                )
        b = await _trajectory(tool, create_kwargs, execute_kwargs, "toolrl-testing-B2")
        a = await _trajectory(tool, other, execute_kwargs, "toolrl-testing-A2")
        await _finish(a, tool, "finishing trajectory A")
        result = await b.call(_call(tool, dict(arguments)))
        if result.status != "ok":
            _fail(
                f"tool {tool.name!r}: finishing trajectory A broke trajectory B ({_describe(result)}); release must "
                "free only the released instance's state"
            )
        await _finish(b, tool, "on trajectory B after A was released")
    finally:
        await tool.close()


async def check_concurrency(tool: Tool, arguments: Mapping[str, Any], *,
                            create_kwargs: Mapping[str, Any] | None = None,
                            execute_kwargs: Mapping[str, Any] | None = None, n: int = 32,
                            timeout_s: float = 60.0) -> list[ToolResult]:
    """``n`` trajectories run the whole lifecycle concurrently; all succeed within ``timeout_s`` and no
    state is left behind."""

    async def one() -> ToolResult:
        async with _started(tool, create_kwargs, execute_kwargs, "under concurrency") as (toolset, _):
            return await toolset.call(_call(tool, dict(arguments)))

    try:
        async with asyncio.timeout(timeout_s):
            results = await asyncio.gather(*(one() for _ in range(n)))
    except TimeoutError:
        _fail(f"tool {tool.name!r}: {n} concurrent lifecycles did not finish within {timeout_s:g} s: a lifecycle "
              "method hangs (an await that never completes, a lock held across calls) or blocks the event loop "
              "(await I/O; move CPU-heavy work to a thread or process pool).")
    failed = [r for r in results if r.status != "ok"]
    if failed:
        _fail(f"tool {tool.name!r}: {len(failed)} of {n} concurrent calls failed; first: {_describe(failed[0])}")
    left = getattr(tool, "_instances", {})
    if left:
        _fail(f"tool {tool.name!r}: {len(left)} instances still hold state after every instance was "
              "released; release must drop the instance's state")
    return results


# -- runtime behaviour: the event loop, cancellation, return values ----------------------------------


async def check_no_loop_blocking(tool: Tool, arguments: Mapping[str, Any], *,
                                 create_kwargs: Mapping[str, Any] | None = None,
                                 execute_kwargs: Mapping[str, Any] | None = None,
                                 threshold_s: float = 0.5) -> LifecycleRun:
    """One lifecycle holds the event loop (steps of toolrl.tools.guard.LOOP_BLOCK_S or longer) for less than
    ``threshold_s`` in total: async methods must not make blocking calls."""
    try:
        lifecycle = await run_lifecycle(tool, dict(arguments), create_kwargs=create_kwargs,
                                        execute_kwargs=execute_kwargs)
    except LifecycleError as exc:
        _fail(f"tool {tool.name!r}: {exc}")
    if lifecycle.loop_blocked_s >= threshold_s:
        _fail(
            f"tool {tool.name!r}: one lifecycle held the event loop for {lifecycle.loop_blocked_s:.2f} s: an async "
            "method makes a blocking call (time.sleep, a synchronous HTTP client, a long computation). Every other "
            "trajectory waits meanwhile, and the call's own timeout cannot fire. Await async I/O, make the method "
            "a plain def (toolrl runs it in a thread), or set isolation: process in the tool's config."
        )
    return lifecycle


async def _guarded_execute(tool: Tool, iid: str, arguments: Mapping[str, Any],
                           execute_kwargs: Mapping[str, Any] | None, timeout_s: float) -> Guarded:
    """``execute`` alone, through the guard Tool.call puts around it (its deadline, its thread)."""
    return await run_guarded(f"tool {tool.name!r} execute", tool.execute, (iid, dict(arguments)),
                             dict(execute_kwargs or {}), timeout_s)


async def check_cancellation(tool: Tool, arguments: Mapping[str, Any], *,
                             create_kwargs: Mapping[str, Any] | None = None,
                             execute_kwargs: Mapping[str, Any] | None = None,
                             deadlines_s: Sequence[float] = (0.001, 0.01, 0.1), grace_s: float = 1.0) -> None:
    """``execute`` runs through the guard Tool.call uses, under deadlines too short to meet; when one
    cuts it off, the call must end by cancellation within ``grace_s`` (not carry on, not return a
    result). A tool fast enough to beat every deadline passes: there is nothing to cancel."""
    for deadline in deadlines_s:
        async with _started(tool, create_kwargs, execute_kwargs, "after a cancelled call") as (_, iid):
            outcome = await _guarded_execute(tool, iid, arguments, execute_kwargs, deadline)
            if outcome.abandoned and outcome.task is not None:
                done, _ = await asyncio.wait({outcome.task}, timeout=grace_s)
                if not done:
                    _fail(
                        f"tool {tool.name!r}: execute was cancelled after {deadline:g} s and was still running "
                        f"{grace_s:g} s later. Do not catch asyncio.CancelledError (or re-raise it after cleaning "
                        "up); a plain def cannot be cancelled: keep it short or use isolation: process."
                    )
                task = outcome.task
                if not task.cancelled():
                    ended = f"raised {type(task.exception()).__name__}" if task.exception() else "returned"
                    _fail(
                        f"tool {tool.name!r}: execute ignored cancellation: cancelled after {deadline:g} s, it "
                        f"{ended} instead of ending with asyncio.CancelledError. Re-raise CancelledError after any "
                        "cleanup: a timed-out call's result is discarded anyway."
                    )
                return


async def check_return_types(tool: Tool, arguments: Mapping[str, Any], *,
                             create_kwargs: Mapping[str, Any] | None = None,
                             execute_kwargs: Mapping[str, Any] | None = None) -> tuple[Any, Any, Any]:
    """``execute`` returns exactly ``(response, step_reward, metrics)``: a str or ToolResponse, a finite
    number, a dict of JSON values. (Rollouts turn anything else into an error result for the model.)"""
    async with _started(tool, create_kwargs, execute_kwargs, "after checking execute's return value") as (_, iid):
        outcome = await _guarded_execute(tool, iid, arguments, execute_kwargs, tool.timeout)
    if outcome.timed_out or outcome.error is not None:
        _fail(f"tool {tool.name!r}: execute with valid_arguments failed: {outcome.error or 'timed out'}")
    value = outcome.value
    try:
        coerce_execute_result(value)
    except ToolReturnError as exc:
        _fail(f"tool {tool.name!r}: {exc}")
    _, reward, metrics = value
    if isinstance(reward, bool) or not isinstance(reward, (int, float)):
        _fail(f"tool {tool.name!r}: execute's step_reward is {reward!r} ({type(reward).__name__}); return a float "
              "(0.0 when there is nothing to reward)")
    if not isinstance(metrics, dict):
        _fail(f"tool {tool.name!r}: execute's metrics are {metrics!r}; return a dict ({{}} when there are none)")
    return value

