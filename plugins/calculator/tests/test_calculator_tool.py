"""The calculator tool through the plugin registry, Tool.call and the inline tag parser."""

from __future__ import annotations

import asyncio
import time

import pytest
from toolrl.testing import ToolConformance, build_tool, run_lifecycle
from toolrl.tools import ToolConfigError


async def call(arguments: object) -> tuple[str, str]:
    tool, _ = await build_tool("calculator")
    iid = await tool.create()
    result = await tool.call(iid, arguments)
    await tool.release(iid)
    return result.status, result.response.text


async def test_lifecycle_through_the_registry() -> None:
    tool, _ = await build_tool("calculator")
    run = await run_lifecycle(tool, {"expression": "2+3*4"})
    assert run.result.response.text == "14"
    assert run.result.status == "ok" and run.result.step_reward == 0.0
    assert run.reward == 0.0
    assert run.order == ["create", "execute", "calc_reward", "release"]


@pytest.mark.parametrize(
    ("arguments", "fields"),
    [
        ({"expr": 1}, ["'expression'", "'expr'"]),
        ({}, ["'expression'"]),
        ({"expression": 7}, ["'expression'"]),
        ({"expression": "1" * 1001}, ["'expression'"]),
        ("2+2", ["JSON object"]),
    ],
)
async def test_invalid_arguments_name_the_field(arguments: object, fields: list[str]) -> None:
    status, text = await call(arguments)
    assert status == "invalid_arguments"
    for field in fields:
        assert field in text, text


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("1/0", "division by zero"),
        ("9**9**9**9", "too large"),
        ("1+", "invalid syntax"),
        ("x", "unknown name"),
    ],
)
async def test_evaluation_errors_are_error_responses(expression: str, reason: str) -> None:
    start = time.perf_counter()
    status, text = await call({"expression": expression})
    assert time.perf_counter() - start < 1.0
    assert status == "error"
    assert text.startswith("Error in 'expression': ") and reason in text


async def test_unknown_config_keys_are_refused() -> None:
    with pytest.raises(ToolConfigError, match="config.precision"):
        await build_tool("calculator", {"precision": 3})
    tool, _ = await build_tool("calculator", {"type": "native", "timeout": 2})
    assert tool.timeout == 2.0


async def test_inline_tag_reaches_the_tool() -> None:
    from toolrl.parsers.tags import TagParser
    from toolrl_calculator.environment import TAG_ROUTES

    parsed = TagParser(**TAG_ROUTES).parse("First <calculator> 2+3*4 </calculator> then <calculator>7/2</calculator>.")
    assert [c.name for c in parsed.calls] == ["calculator", "calculator"]
    tool, _ = await build_tool("calculator")
    iid = await tool.create()
    results = [await tool.call(iid, c.arguments) for c in parsed.calls]
    assert [r.response.text for r in results] == ["14", "3.5"]


async def test_many_concurrent_calls() -> None:
    tool, _ = await build_tool("calculator")
    iids = [await tool.create() for _ in range(200)]
    results = await asyncio.gather(*(tool.call(i, {"expression": f"{n}*{n}"}) for n, i in enumerate(iids)))
    assert [r.response.text for r in results] == [str(n * n) for n in range(200)]


class TestCalculatorConformance(ToolConformance):
    tool_name = "calculator"
    tool_config = {}
    valid_arguments = {"expression": "2+3*4"}
    invalid_arguments = [
        {"expr": 1},
        {"expression": "1+"},
        {"expression": "1/0"},
        {"expression": "9**9**9**9"},
    ]
    expected_text = "14"


class TestCalculatorFromToolsFile(ToolConformance):
    """The same tool loaded from a verl-layout tools YAML (with a toolrl name as class_name)."""

    tools_config_file = "calculator_tools.yaml"
    tool_name = "calculator"
    valid_arguments = {"expression": "sqrt(16)"}
    invalid_arguments = [{"expression": "sqrt(-1)"}]
    expected_text = "4"
