"""Self-tests of the conformance kit (toolrl.testing): each deliberately broken tool below has one
defect, and the kit must catch it with a message that names the defect."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
from toolrl import testing as kit
from toolrl.plugins import PluginInfo, Plugins
from toolrl.plugins.registry import Part
from toolrl.schemas import ToolResponse
from toolrl.tools import Tool

ARGS = {"answer": "3"}


class GoodTool(Tool):
    """A correct reference tool: grades an answer against the ground truth from create_kwargs."""

    schema: ClassVar[dict[str, Any]] = {
        "type": "function",
        "function": {
            "name": "grade",
            "description": "Grade an answer.",
            "parameters": {
                "type": "object",
                "properties": {"answer": {"type": "string", "description": "The answer."}},
                "required": ["answer"],
                "additionalProperties": False,
            },
        },
    }

    async def execute(self, instance_id, arguments, **kwargs):
        state = self.state(instance_id)
        state["score"] = 1.0 if arguments["answer"] == state.get("ground_truth") else 0.0
        return f"score={state['score']}", 0.0, {}

    async def calc_reward(self, instance_id, **kwargs):
        return self.state(instance_id).get("score", 0.0)


class EagerReleaseTool(GoodTool):
    """Lifecycle-order bug: cleans up inside execute, so calc_reward runs on a released instance."""

    async def execute(self, instance_id, arguments, **kwargs):
        response = await super().execute(instance_id, arguments, **kwargs)
        await self.release(instance_id)
        return response

    async def calc_reward(self, instance_id, **kwargs):
        return self._instances.get(instance_id, {}).get("score", 0.0)


class LazyCreateTool(GoodTool):
    """Lifecycle-order bug: re-creates its instance inside execute, losing create_kwargs."""

    async def execute(self, instance_id, arguments, **kwargs):
        await self.create(instance_id)
        return await super().execute(instance_id, arguments, **kwargs)


class UnnamedErrorTool(GoodTool):
    """Missing-field-name bug: a lenient schema, and execute fails with a message naming no field."""

    schema: ClassVar[dict[str, Any]] = {
        "type": "function",
        "function": {
            "name": "unnamed",
            "description": "Parse a number.",
            "parameters": {"type": "object", "properties": {"answer": {"type": "string"}}},
        },
    }

    async def execute(self, instance_id, arguments, **kwargs):
        self.state(instance_id)
        return f"{float(arguments.get('answer', 'nan')) + 1}", 0.0, {}


class AcceptsAnythingTool(UnnamedErrorTool):
    async def execute(self, instance_id, arguments, **kwargs):
        return "fine", 0.0, {}


class SharedStateTool(GoodTool):
    """Isolation bug: keeps the ground truth on the tool object, so the last create wins."""

    async def create(self, instance_id=None, **kwargs):
        self.ground_truth = kwargs.get("ground_truth")
        return await super().create(instance_id, **kwargs)

    async def execute(self, instance_id, arguments, **kwargs):
        self.state(instance_id)["score"] = 1.0 if arguments["answer"] == self.ground_truth else 0.0
        return f"score={self.state(instance_id)['score']}", 0.0, {}


class StatelessTool(GoodTool):
    """Never looks at the instance, so calls on released instances succeed."""

    async def execute(self, instance_id, arguments, **kwargs):
        return "ok", 0.0, {}


class StrictReleaseTool(GoodTool):
    async def release(self, instance_id, **kwargs):
        del self._instances[instance_id]


class LeakyReleaseTool(GoodTool):
    async def release(self, instance_id, **kwargs):
        pass


class NoneRewardTool(GoodTool):
    async def calc_reward(self, instance_id, **kwargs):
        return self.state(instance_id).get("score")


class BoolRewardTool(GoodTool):
    async def calc_reward(self, instance_id, **kwargs):
        return True


class HangingTool(GoodTool):
    """Waits for a backend that never answers (and has a long per-call timeout)."""

    default_timeout = 3600.0

    async def execute(self, instance_id, arguments, **kwargs):
        await asyncio.Event().wait()


class FailingCreateTool(GoodTool):
    async def create(self, instance_id=None, **kwargs):
        raise RuntimeError("no backend")


class UndescribedTool(GoodTool):
    schema: ClassVar[dict[str, Any]] = {
        "type": "function",
        "function": {"name": "grade", "parameters": GoodTool.schema["function"]["parameters"]},
    }


class DottedNameTool(GoodTool):
    schema: ClassVar[dict[str, Any]] = {
        "type": "function",
        "function": {**GoodTool.schema["function"], "name": "my.grader"},
    }


class BlockingTool(GoodTool):
    """Makes a blocking call inside async def."""

    async def execute(self, instance_id, arguments, **kwargs):
        time.sleep(0.6)
        return await super().execute(instance_id, arguments, **kwargs)


class StubbornTool(GoodTool):
    """Swallows cancellation and returns anyway."""

    async def execute(self, instance_id, arguments, **kwargs):
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0.3)
        return await super().execute(instance_id, arguments, **kwargs)


class SlowButPoliteTool(GoodTool):
    """Awaits (so the deadline cuts it off) and honours cancellation."""

    async def execute(self, instance_id, arguments, **kwargs):
        await asyncio.sleep(0.05)
        return await super().execute(instance_id, arguments, **kwargs)


class PlainDefTool(GoodTool):
    """A plain def execute: runs in a thread."""

    def execute(self, instance_id, arguments, **kwargs):
        time.sleep(0.6)
        state = self.state(instance_id)
        return f"score={1.0 if arguments['answer'] == state.get('ground_truth') else 0.0}", 0.0, {}


class WrongReturnTool(GoodTool):
    returns: ClassVar[Any] = None

    async def execute(self, instance_id, arguments, **kwargs):
        return self.returns


CREATE = {"ground_truth": "3"}


# -- the correct tool passes every check ----------------------------------------------------------


async def test_reference_tool_passes_every_check() -> None:
    kit.check_schema(GoodTool(), ARGS)
    run = await kit.check_lifecycle(GoodTool(), ARGS, create_kwargs=CREATE, expected_text="score=1.0")
    assert run.reward == 1.0 and run.order == ["create", "execute", "calc_reward", "release"]
    await kit.check_invalid_arguments(
        GoodTool(),
        kit.derive_invalid_arguments(GoodTool.schema["function"]["parameters"], ARGS),
        ARGS,
        create_kwargs=CREATE,
    )

    async def build() -> Tool:
        return GoodTool()

    await kit.check_isolation(build, ARGS, create_kwargs=CREATE, other_create_kwargs={"ground_truth": "4"})
    await kit.check_released_and_unknown(GoodTool(), ARGS, create_kwargs=CREATE)
    await kit.check_release_idempotent(GoodTool(), ARGS, create_kwargs=CREATE)
    assert await kit.check_calc_reward(GoodTool(), ARGS, create_kwargs=CREATE) == (0.0, 1.0)
    await kit.check_concurrency(GoodTool(), ARGS, create_kwargs=CREATE, n=50, timeout_s=10)
    await kit.check_no_loop_blocking(GoodTool(), ARGS, create_kwargs=CREATE)
    await kit.check_cancellation(GoodTool(), ARGS, create_kwargs=CREATE)
    assert await kit.check_return_types(GoodTool(), ARGS, create_kwargs=CREATE) == ("score=1.0", 0.0, {})


# -- runtime behaviour ----------------------------------------------------------------------------


async def test_kit_catches_blocking_the_event_loop() -> None:
    with pytest.raises(AssertionError, match=r"held the event loop for 0\.\d+ s: an async method makes a blocking"):
        await kit.check_no_loop_blocking(BlockingTool(), ARGS, create_kwargs=CREATE)
    await kit.check_no_loop_blocking(PlainDefTool(), ARGS, create_kwargs=CREATE)  # a thread holds nothing


async def test_kit_catches_ignored_cancellation() -> None:
    with pytest.raises(AssertionError, match="execute ignored cancellation: cancelled after 0.001 s, it returned"):
        await kit.check_cancellation(StubbornTool(), ARGS, create_kwargs=CREATE)
    await kit.check_cancellation(SlowButPoliteTool(), ARGS, create_kwargs=CREATE)


@pytest.mark.parametrize(("returns", "message"), [
    ("score=1", "execute must return (response, step_reward, metrics), got str"),
    ((b"x", 0.0, {}), "response must be a str or a ToolResponse, got bytes"),
    (("x", "1", {}), "step_reward must be a number, got str"),
    (("x", float("nan"), {}), "step_reward must be finite"),
    (("x", None, {}), "step_reward is None"),
    (("x", 0.0, [1]), "metrics must be a dict with str keys, got list"),
    (("x", 0.0, None), "metrics are None"),
])
async def test_kit_catches_wrong_return_types(returns: Any, message: str) -> None:
    tool = WrongReturnTool()
    tool.returns = returns
    with pytest.raises(AssertionError, match=re.escape(message)):
        await kit.check_return_types(tool, ARGS, create_kwargs=CREATE)


# -- lifecycle order ------------------------------------------------------------------------------


async def test_kit_catches_release_inside_execute() -> None:
    with pytest.raises(AssertionError, match="release was called from inside execute") as info:
        await kit.check_lifecycle(EagerReleaseTool(), ARGS, create_kwargs=CREATE)
    assert "create -> execute -> calc_reward -> release" in str(info.value)
    assert "Recorded: create(" in str(info.value)


async def test_kit_catches_create_inside_execute() -> None:
    with pytest.raises(AssertionError, match="create was called from inside execute"):
        await kit.check_lifecycle(LazyCreateTool(), ARGS, create_kwargs=CREATE)


async def test_recorder_sees_nested_calls_in_order() -> None:
    tool = EagerReleaseTool()
    run = await kit.run_lifecycle(tool, ARGS, create_kwargs=CREATE)
    assert run.order == ["create", "execute", "release", "calc_reward", "release"]
    assert [c.caller for c in run.calls] == [None, None, "execute", None, None]
    assert kit.instrument(tool) is kit.instrument(tool)  # instrumenting twice keeps one recorder


def test_check_order_rules() -> None:
    def calls(*spec: str) -> list[kit.LifecycleCall]:
        return [kit.LifecycleCall(m, "i") for m in spec]

    kit.check_order(calls("create", "execute", "execute", "calc_reward", "release", "release"), "i")
    with pytest.raises(AssertionError, match="first call was not create"):
        kit.check_order(calls("execute", "create", "calc_reward", "release"), "i")
    with pytest.raises(AssertionError, match="calc_reward ran after release"):
        kit.check_order(calls("create", "execute", "release", "calc_reward"), "i")
    with pytest.raises(AssertionError, match="release never ran"):
        kit.check_order(calls("create", "execute", "calc_reward"), "i")
    with pytest.raises(AssertionError, match="did not run execute"):
        kit.check_order(calls("create", "calc_reward", "release"), "i")
    with pytest.raises(AssertionError, match="create ran more than once"):
        kit.check_order(calls("create", "create", "execute", "calc_reward", "release"), "i")
    with pytest.raises(AssertionError, match="ran on instance 'j'"):
        kit.check_order([*calls("create", "execute"), kit.LifecycleCall("calc_reward", "j"), *calls("release")], "i")


async def test_lifecycle_error_names_the_stage() -> None:
    with pytest.raises(kit.LifecycleError) as info:
        await kit.run_lifecycle(FailingCreateTool(), ARGS)
    assert info.value.stage == "create" and "RuntimeError: no backend" in str(info.value)
    with pytest.raises(AssertionError, match="create failed: RuntimeError: no backend"):
        await kit.check_lifecycle(FailingCreateTool(), ARGS)


async def test_a_tool_that_gives_no_reward_passes_the_lifecycle() -> None:
    """calc_reward returning None means the tool gives no reward (ToolSet.finish leaves it out): not a defect."""

    class NoReward(GoodTool):
        async def calc_reward(self, instance_id: str, **kwargs: Any) -> None:
            return None

    assert (await kit.check_lifecycle(NoReward(), ARGS, create_kwargs=CREATE)).reward is None
    assert (await kit.run_lifecycle(GoodTool(), ARGS, create_kwargs=CREATE)).reward is not None


async def test_kit_catches_a_failing_valid_call_and_missing_text() -> None:
    with pytest.raises(AssertionError, match="valid_arguments .* failed"):
        await kit.check_lifecycle(GoodTool(), {"answer": 3}, create_kwargs=CREATE)
    with pytest.raises(AssertionError, match="expected 'score=7' in the response"):
        await kit.check_lifecycle(GoodTool(), ARGS, create_kwargs=CREATE, expected_text="score=7")


async def test_kit_catches_state_left_after_release() -> None:
    with pytest.raises(AssertionError, match="release left the instance's state"):
        await kit.check_lifecycle(LeakyReleaseTool(), ARGS, create_kwargs=CREATE)
    with pytest.raises(AssertionError, match="still hold state"):
        await kit.check_concurrency(LeakyReleaseTool(), ARGS, create_kwargs=CREATE, n=4)


# -- error paths ----------------------------------------------------------------------------------


async def test_kit_catches_an_error_that_names_no_field() -> None:
    with pytest.raises(AssertionError, match="names no field") as info:
        await kit.check_invalid_arguments(UnnamedErrorTool(), [{"answer": "three"}], {"answer": "3"})
    assert "expected one of ['answer']" in str(info.value)
    assert "could not convert string to float" in str(info.value)  # shows the tool's actual text


async def test_kit_catches_invalid_arguments_that_are_accepted() -> None:
    with pytest.raises(AssertionError, match="was accepted"):
        await kit.check_invalid_arguments(AcceptsAnythingTool(), [{"answer": "x", "extra": 1}], {"answer": "3"})


def test_derived_invalid_arguments() -> None:
    params = {
        "type": "object",
        "properties": {"answer": {"type": "string"}, "n": {"type": "integer"}, "tags": {"type": "array"}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    derived = kit.derive_invalid_arguments(params, {"answer": "3", "n": 1})
    assert {"n": 1} in derived  # required field missing
    assert {"answer": "3", "n": 1, "toolrl_unexpected_field": 1} in derived
    assert {"answer": 12345, "n": 1} in derived and {"answer": "3", "n": "not a number"} in derived
    assert not any("tags" in d for d in derived)  # only fields present in the valid call are retyped


async def test_kit_catches_calls_on_released_instances() -> None:
    with pytest.raises(AssertionError, match="a call on a released instance succeeded"):
        await kit.check_released_and_unknown(StatelessTool(), ARGS)


async def test_kit_catches_non_idempotent_release() -> None:
    with pytest.raises(AssertionError, match="release twice raised KeyError"):
        await kit.check_release_idempotent(StrictReleaseTool(), ARGS, create_kwargs=CREATE)


async def test_kit_catches_non_float_rewards() -> None:
    with pytest.raises(AssertionError, match="before any call returned None"):
        await kit.check_calc_reward(NoneRewardTool(), ARGS, create_kwargs=CREATE)
    with pytest.raises(AssertionError, match=r"returned True \(bool\)"):
        await kit.check_calc_reward(BoolRewardTool(), ARGS, create_kwargs=CREATE)


# -- isolation and concurrency ----------------------------------------------------------------------


async def test_kit_catches_state_shared_between_instances() -> None:
    async def build() -> Tool:
        return SharedStateTool()

    with pytest.raises(
        AssertionError, match="trajectory A .* gave different results next to the other trajectory"
    ) as info:
        await kit.check_isolation(build, ARGS, create_kwargs=CREATE, other_create_kwargs={"ground_truth": "4"})
    assert "self.state(instance_id)" in str(info.value)


async def test_kit_catches_a_tool_that_hangs() -> None:
    with pytest.raises(AssertionError, match="8 concurrent lifecycles did not finish within 0.5 s"):
        await kit.check_concurrency(HangingTool(), ARGS, create_kwargs=CREATE, n=8, timeout_s=0.5)


# -- schema and registration ----------------------------------------------------------------------


def test_kit_checks_the_schema() -> None:
    with pytest.raises(AssertionError, match="has no description"):
        kit.check_schema(UndescribedTool(), ARGS)
    with pytest.raises(AssertionError, match="not a valid OpenAI function name"):
        kit.check_schema(DottedNameTool(), ARGS)
    with pytest.raises(
        AssertionError, match=r"valid_arguments \{'answer': 3\} do not validate.*answer: 3 is not"
    ):
        kit.check_schema(GoodTool(), {"answer": 3})


def test_kit_explains_unregistered_and_broken_plugins(toolrl_plugins: Plugins) -> None:
    kit.check_registered("calculator", toolrl_plugins)
    with pytest.raises(AssertionError, match="unknown tool 'no_such_tool'.*register_tools hook"):
        kit.check_registered("no_such_tool", toolrl_plugins)
    toolrl_plugins.info["calculator"].status = "error"
    toolrl_plugins.info["calculator"].error = "ImportError: boom"
    with pytest.raises(AssertionError, match="status is 'error': ImportError: boom"):
        kit.check_registered("calculator", toolrl_plugins)


def test_disabled_plugin_is_not_found(monkeypatch: pytest.MonkeyPatch, toolrl_reload_plugins) -> None:
    monkeypatch.setenv("TOOLRL_DISABLE_PLUGINS", "calculator")
    plugins = toolrl_reload_plugins()
    assert plugins.info["calculator"].status == "disabled"
    with pytest.raises(AssertionError, match="unknown tool 'calculator'"):
        kit.check_registered("calculator")


# -- the mixin end to end, on registered broken tools ------------------------------------------------


@pytest.fixture
def register_tool(toolrl_reload_plugins) -> Iterator[Any]:
    """Registers tool classes into the process-wide registry as plugin 'kit-selftest'."""
    plugins = toolrl_reload_plugins()
    plugins.info["kit-selftest"] = PluginInfo(name="kit-selftest", distribution="kit-selftest", version="0")

    def register(name: str, cls: type[Tool]) -> None:
        assert plugins.registry.add(Part("tools", name, "kit-selftest", cls)) is None

    yield register


class EagerReleaseConformance(kit.ToolConformance):  # no "Test" prefix: run by hand below, not collected
    tool_name = "selftest_eager_release"
    valid_arguments = ARGS
    create_kwargs = CREATE


class UnnamedErrorConformance(kit.ToolConformance):
    tool_name = "selftest_unnamed"
    valid_arguments = {"answer": "3"}
    invalid_arguments = [{"answer": "three"}]


class SharedStateConformance(kit.ToolConformance):
    tool_name = "selftest_shared"
    valid_arguments = ARGS
    create_kwargs = CREATE
    other_create_kwargs = {"ground_truth": "4"}


def test_mixin_passes_a_good_tool_and_fails_broken_ones(register_tool) -> None:
    register_tool("selftest_eager_release", EagerReleaseTool)
    register_tool("selftest_unnamed", UnnamedErrorTool)
    register_tool("selftest_shared", SharedStateTool)

    eager = EagerReleaseConformance()
    eager.test_resolves_through_an_ok_plugin()
    eager.test_schema_is_a_valid_openai_function()
    with pytest.raises(AssertionError, match="release was called from inside execute"):
        eager.test_lifecycle_runs_in_order()

    unnamed = UnnamedErrorConformance()
    with pytest.raises(AssertionError, match="names no field"):
        unnamed.test_invalid_arguments_give_errors_naming_a_field()

    shared = SharedStateConformance()
    shared.test_lifecycle_runs_in_order()  # alone it works...
    with pytest.raises(AssertionError, match="gave different results next to the other trajectory"):
        shared.test_instances_are_isolated()  # ...but not next to another trajectory


def test_mixin_without_tool_name_says_so() -> None:
    class Unset(kit.ToolConformance):
        valid_arguments = ARGS

    with pytest.raises(AssertionError, match="set tool_name"):
        Unset().test_lifecycle_runs_in_order()


async def test_build_tool_from_a_tools_file_reports_a_missing_name(tmp_path) -> None:
    path = tmp_path / "tools.yaml"
    path.write_text("tools:\n  - class_name: calculator\n")
    tool, class_name = await kit.build_tool("calculator", tools_config_file=path)
    assert (tool.name, class_name) == ("calculator", "calculator")
    with pytest.raises(AssertionError, match="builds no tool whose function name is 'grade'"):
        await kit.build_tool("grade", tools_config_file=path)


async def test_error_responses_from_execute_count_as_errors() -> None:
    class ErrorResponseTool(GoodTool):
        async def execute(self, instance_id, arguments, **kwargs):
            self.state(instance_id)
            if arguments["answer"] != "3":
                return ToolResponse.error("field 'answer': must be a number"), 0.0, {}
            return "ok", 0.0, {}

    [result] = await kit.check_invalid_arguments(ErrorResponseTool(), [{"answer": "x"}], ARGS)
    assert result.status == "error"
