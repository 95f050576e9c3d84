"""``ToolConformance``: a mixin that gives a test class every conformance check as a pytest test."""

from __future__ import annotations

import asyncio
import inspect
import os
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from toolrl.testing import checks
from toolrl.tools import Tool

T = TypeVar("T")


class ToolConformance:
    """Subclass as ``class TestMyTool(ToolConformance)`` and set the class attributes; pytest then
    collects one test per check. The tests are synchronous (each runs its own event loop), so they need
    no asyncio plugin."""

    #: Registered tool name or alias (e.g. a verl class path). With ``tools_config_file``: the function
    #: name of one tool in that file.
    tool_name: ClassVar[str] = ""
    #: The tool's config mapping (``config:`` of a tools-YAML entry).
    tool_config: ClassVar[Mapping[str, Any]] = {}
    #: A verl-format tools YAML to build the tool from instead; relative paths are relative to the test file.
    tools_config_file: ClassVar[str | os.PathLike | None] = None
    #: Arguments of one call the tool accepts.
    valid_arguments: ClassVar[Mapping[str, Any]] = {}
    #: Calls that must come back as error responses naming a field. The kit adds calls derived from the
    #: schema (missing required field, unexpected field, wrong type) unless ``derive_invalid_arguments``
    #: is False.
    invalid_arguments: ClassVar[list[Mapping[str, Any]]] = []
    derive_invalid_arguments: ClassVar[bool] = True
    #: Per-trajectory kwargs (verl's ``tools_kwargs[name]``).
    create_kwargs: ClassVar[Mapping[str, Any]] = {}
    execute_kwargs: ClassVar[Mapping[str, Any]] = {}
    #: create_kwargs of the second instance in the isolation check; make it differ from
    #: ``create_kwargs`` (e.g. another ground truth) so leaked state changes results.
    other_create_kwargs: ClassVar[Mapping[str, Any] | None] = None
    #: A substring the valid call's response must contain.
    expected_text: ClassVar[str | None] = None
    #: False when identical calls may legitimately give different text (times, random ids).
    deterministic: ClassVar[bool] = True
    concurrent_lifecycles: ClassVar[int] = 32
    #: The most one lifecycle may hold the event loop, in seconds (blocking calls in async methods).
    blocking_threshold_s: ClassVar[float] = 0.5
    #: How long a cancelled execute may take to end.
    cancellation_grace_s: ClassVar[float] = 1.0
    #: Limit for each check, in seconds.
    check_timeout_s: ClassVar[float] = 120.0

    # -- plumbing -------------------------------------------------------------------------------

    def _config_file(self) -> str | None:
        """``tools_config_file``, a relative path taken from the test file's directory."""
        if self.tools_config_file is None:
            return None
        path = Path(self.tools_config_file)
        return str(path if path.is_absolute() else Path(inspect.getfile(type(self))).resolve().parent / path)

    async def _build_tool(self) -> Tool:
        if not self.tool_name:
            raise AssertionError(
                f"{type(self).__name__}: set tool_name to the registered name of the tool to check"
            )
        tool, _ = await checks.build_tool(self.tool_name, self.tool_config, self._config_file())
        return tool

    def _run(self, check: Callable[[], Awaitable[T]]) -> T:
        async def bounded() -> T:
            try:
                async with asyncio.timeout(self.check_timeout_s):
                    return await check()
            except TimeoutError:
                raise AssertionError(
                    f"tool {self.tool_name!r}: the check did not finish within {self.check_timeout_s:g} s "
                    "(a lifecycle method hangs or blocks the event loop)"
                ) from None

        return asyncio.run(bounded())

    def _with_tool(self, check: Callable[[Tool], Awaitable[T]]) -> T:
        async def run() -> T:
            tool = await self._build_tool()
            try:
                return await check(tool)
            finally:
                await tool.close()

        return self._run(run)

    def _kwargs(self) -> dict[str, Any]:
        return {"create_kwargs": dict(self.create_kwargs), "execute_kwargs": dict(self.execute_kwargs)}

    def _check(self, check: Callable[..., Awaitable[T]], **options: Any) -> T:
        """``check(tool, valid_arguments, create_kwargs=..., execute_kwargs=..., **options)`` on a built tool."""
        return self._with_tool(lambda tool: check(tool, self.valid_arguments, **self._kwargs(), **options))

    # -- the tests ------------------------------------------------------------------------------

    def test_resolves_through_an_ok_plugin(self) -> None:
        async def check() -> None:
            if self.tools_config_file is None:
                checks.check_registered(self.tool_name)
                await (await self._build_tool()).close()  # it must also build with tool_config
                return
            tool, class_name = await checks.build_tool(self.tool_name, None, self._config_file())
            await tool.close()
            checks.check_registered(class_name)

        self._run(check)

    def test_schema_is_a_valid_openai_function(self) -> None:
        async def check(tool: Tool) -> None:
            checks.check_schema(tool, self.valid_arguments)

        self._with_tool(check)

    def test_lifecycle_runs_in_order(self) -> None:
        self._check(checks.check_lifecycle, expected_text=self.expected_text)

    def test_invalid_arguments_give_errors_naming_a_field(self) -> None:
        async def check(tool: Tool) -> None:
            cases = [dict(a) for a in self.invalid_arguments]
            if self.derive_invalid_arguments:
                derived = checks.derive_invalid_arguments(
                    tool.tool_schema.function.parameters, self.valid_arguments
                )
                cases += [d for d in derived if d not in cases]
            if not cases:
                raise AssertionError(
                    f"{type(self).__name__}: no invalid calls to check; set invalid_arguments (the schema has no "
                    "required fields, additionalProperties: false or typed properties to derive them from)"
                )
            await checks.check_invalid_arguments(tool, cases, self.valid_arguments, **self._kwargs())

        self._with_tool(check)

    def test_instances_are_isolated(self) -> None:
        self._run(
            lambda: checks.check_isolation(
                self._build_tool,
                self.valid_arguments,
                other_create_kwargs=self.other_create_kwargs,
                deterministic=self.deterministic,
                **self._kwargs(),
            )
        )

    def test_released_and_unknown_instances_give_errors(self) -> None:
        self._check(checks.check_released_and_unknown)

    def test_release_is_idempotent(self) -> None:
        self._check(checks.check_release_idempotent)

    def test_calc_reward_returns_a_float(self) -> None:
        self._check(checks.check_calc_reward)

    def test_many_concurrent_lifecycles_complete(self) -> None:
        self._check(checks.check_concurrency, n=self.concurrent_lifecycles, timeout_s=self.check_timeout_s)

    def test_does_not_block_the_event_loop(self) -> None:
        self._check(checks.check_no_loop_blocking, threshold_s=self.blocking_threshold_s)

    def test_stops_when_cancelled(self) -> None:
        self._check(checks.check_cancellation, grace_s=self.cancellation_grace_s)

    def test_execute_returns_response_reward_metrics(self) -> None:
        self._check(checks.check_return_types)
