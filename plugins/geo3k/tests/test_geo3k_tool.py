"""calc_geo3k_reward: ground truth through create_kwargs, step penalties, verl configs, the CLI, the kit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from toolrl.schemas import Sample, ToolCall
from toolrl.testing import ToolConformance, build_tool, run_lifecycle
from toolrl.tools import ToolSet
from toolrl.tools.verl_config import build_tools, load_tools_file

HERE = Path(__file__).parent


async def test_ground_truth_reaches_the_tool() -> None:
    tool, _ = await build_tool("calc_geo3k_reward")
    run = await run_lifecycle(tool, {"answer": "3"}, create_kwargs={"ground_truth": "3"})
    assert run.result.response.text == "Current parsed answer='3' reward=1.0"
    assert run.result.step_reward == 0.0 and run.result.metrics == {"score": 1.0}
    assert run.reward == 1.0
    assert run.order == ["create", "execute", "calc_reward", "release"]


async def test_step_rewards_follow_the_best_score() -> None:
    tool, _ = await build_tool("calc_geo3k_reward")
    iid = await tool.create(None, ground_truth="\\frac{1}{2}")
    steps = []
    for answer in ["4", "5", "0.5", "\\boxed{1/2}", "4"]:
        result = await tool.call(iid, {"answer": answer})
        steps.append((result.response.text.rsplit(" ", 1)[1], result.step_reward))
    assert steps == [
        ("reward=0.0", -0.05),  # wrong: no improvement on 0
        ("reward=0.0", -0.05),  # repeated wrong answers keep costing
        ("reward=1.0", 0.0),  # improvement
        ("reward=1.0", -0.05),  # equivalent answer again: no improvement
        ("reward=0.0", -0.05),
    ]
    assert await tool.calc_reward(iid) == 1.0  # the best score, not the last
    await tool.release(iid)


async def test_penalty_is_configurable_and_config_is_checked() -> None:
    tool, _ = await build_tool("calc_geo3k_reward", {"no_improvement_penalty": -0.2})
    run = await run_lifecycle(tool, {"answer": "1"}, create_kwargs={"ground_truth": "2"})
    assert run.result.step_reward == -0.2 and run.reward == 0.0
    with pytest.raises(ValueError, match="config.penalty"):
        await build_tool("calc_geo3k_reward", {"penalty": 1})


async def test_missing_ground_truth_is_an_error_not_a_silent_zero() -> None:
    tool, _ = await build_tool("calc_geo3k_reward")
    with pytest.raises(ValueError, match="create_kwargs.ground_truth"):
        await tool.create(None)
    # In a rollout the ToolSet records the failure and the model gets an explicit error.
    tools = ToolSet({"calc_geo3k_reward": tool}, tools_kwargs={})
    await tools.start()
    result = await tools.call(ToolCall(name="calc_geo3k_reward", arguments={"answer": "3"}))
    assert result.status == "error" and "create_kwargs.ground_truth" in result.response.text


async def test_verl_tool_config_loads_unchanged() -> None:
    tools = await build_tools(load_tools_file(HERE / "verl_geo3k_tool_config.yaml"))
    tool = tools["calc_geo3k_reward"]
    assert type(tool).__module__ == "toolrl_geo3k.tool"
    assert tool.tool_schema.function.description.startswith("Grades a Geometry3K answer")  # the file's schema
    run = await run_lifecycle(tool, {"answer": "\\boxed{3}"}, create_kwargs={"ground_truth": "3"})
    assert run.reward == 1.0


async def test_dataset_row_to_tool_through_tools_kwargs() -> None:
    row = {
        "prompt": [{"role": "user", "content": "<image>Find x."}],
        "reward_model": {"style": "rule", "ground_truth": "2\\sqrt{3}"},
        "extra_info": {
            "tools_kwargs": {
                "calc_geo3k_reward": {"create_kwargs": {"ground_truth": "2\\sqrt{3}"}, "execute_kwargs": None}
            }
        },
    }
    sample = Sample.model_validate(row)
    tool, _ = await build_tool("calc_geo3k_reward")
    tools = ToolSet({tool.name: tool}, sample.tools_kwargs)
    await tools.start()
    wrong = await tools.call(ToolCall(name="calc_geo3k_reward", arguments={"answer": "3.4"}))
    right = await tools.call(ToolCall(name="calc_geo3k_reward", arguments={"answer": "\\sqrt{12}"}))
    assert (wrong.step_reward, right.step_reward) == (-0.05, 0.0)
    assert await tools.finish() == {"calc_geo3k_reward": 1.0}
    assert tool._instances == {}


def _toolrl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "toolrl", *args], capture_output=True, text=True, timeout=120
    )


def test_cli_tool_call_reports_reward() -> None:
    done = _toolrl(
        "tool",
        "call",
        "calc_geo3k_reward",
        '{"answer":"3"}',
        "--create-kwargs",
        '{"ground_truth":"3"}',
        "--json",
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["reward"] == 1.0 and out["step_reward"] == 0.0
    assert out["text"] == "Current parsed answer='3' reward=1.0"


def test_cli_wrong_answer_and_invalid_arguments() -> None:
    wrong = _toolrl(
        "tool",
        "call",
        "calc_geo3k_reward",
        '{"answer":"4"}',
        "--create-kwargs",
        '{"ground_truth":"3"}',
        "--json",
    )
    assert wrong.returncode == 0, wrong.stderr
    assert json.loads(wrong.stdout)["reward"] == 0.0 and json.loads(wrong.stdout)["step_reward"] == -0.05
    invalid = _toolrl(
        "tool", "call", "calc_geo3k_reward", '{"ans": "3"}', "--create-kwargs", '{"ground_truth":"3"}'
    )
    assert invalid.returncode == 1 and "'answer'" in invalid.stdout + invalid.stderr


class TestGeo3kConformance(ToolConformance):
    tool_name = "calc_geo3k_reward"
    valid_arguments = {"answer": "3"}
    invalid_arguments = [{"ans": "3"}, {"answer": 3}]
    create_kwargs = {"ground_truth": "3"}
    other_create_kwargs = {"ground_truth": "4"}
    expected_text = "reward=1.0"


class TestGeo3kVerlAliasConformance(ToolConformance):
    """The verl class path, through verl's own tool config file."""

    tools_config_file = "verl_geo3k_tool_config.yaml"
    tool_name = "calc_geo3k_reward"
    valid_arguments = {"answer": "\\frac{1}{2}"}
    create_kwargs = {"ground_truth": "0.5"}
    other_create_kwargs = {"ground_truth": "2"}
    expected_text = "reward=1.0"
