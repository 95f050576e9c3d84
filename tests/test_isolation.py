"""``isolation: process``: the tool runs in a worker process; crashes and overruns cost the calls in
flight, never the run, and the worker is replaced."""

import asyncio
import time

import pytest
from _dists import run_toolrl
from faulty_tools import BlocksLoop, Echo, Exits, Floods, IgnoresCancel, SyncSleeps
from toolrl.schemas import ToolCall, ToolKwargs
from toolrl.tools import ToolConfigError, ToolSet
from toolrl.tools.isolation import ProcessTool
from toolrl.tools.verl_config import build_tools, parse_tools_config

ISOLATED = {"isolation": "process"}


async def isolated(cls, **config):
    return await ProcessTool.start(cls, {**ISOLATED, **config}, None)


async def test_a_tool_that_kills_its_process_is_survived():
    tool = await isolated(Exits, timeout=30)
    try:
        toolset = ToolSet({"exits": tool})
        await toolset.start()
        first = await toolset.call(ToolCall(name="exits", arguments={"x": 0}))
        crash = await toolset.call(ToolCall(name="exits", arguments={"x": 1}))
        after = await toolset.call(ToolCall(name="exits", arguments={"x": 0}))
        assert first.status == "ok" and after.status == "ok" and first.response.text != after.response.text
        assert crash.status == "error" and "worker process exited with code 7" in crash.response.text
        assert await toolset.finish() == {"exits": 0.0} and not toolset.finish_errors
        assert tool.workers_started == 2
    finally:
        await tool.close()


async def test_instances_are_created_again_on_a_fresh_worker():
    tool = await isolated(Echo)
    try:
        iid = await tool.create(reward=3)
        pid = (await tool.call(iid, {"x": 1})).metrics["pid"]
        tool._worker.kill("test")
        await asyncio.sleep(0.5)
        again = await tool.call(iid, {"x": 2})
        assert again.status == "ok" and again.metrics["pid"] != pid
        assert await tool.calc_reward(iid) == 3.0  # create_kwargs survived the replacement
        await tool.release(iid)
        assert (await tool.call(iid, {"x": 3})).status == "error"  # released: gone
    finally:
        await tool.close()


@pytest.mark.parametrize("cls, kwargs", [
    (BlocksLoop, {"block_s": 30}),      # holds the worker's event loop
    (IgnoresCancel, {"sleep_s": 30}),   # swallows cancellation
    (SyncSleeps, {"sleep_s": 30}),      # a plain def still running in its thread
])
async def test_an_overrunning_call_gets_its_worker_killed_and_replaced(cls, kwargs):
    tool = await isolated(cls, timeout=0.5)
    try:
        iid = await tool.create()
        start = time.perf_counter()
        result = await tool.call(iid, {}, **kwargs)
        assert result.status == "timeout" and time.perf_counter() - start < 2
        dead = tool._worker
        for _ in range(100):
            if not dead.alive:
                break
            await asyncio.sleep(0.05)
        assert "overran its timeout" in dead.death
        fine = {"block_s": 0.0} if cls is BlocksLoop else {"sleep_s": 0.0}
        assert (await tool.call(iid, {}, **fine)).status == "ok"
    finally:
        await tool.close()


async def test_a_flood_of_output_does_not_stall_the_worker(capfd):
    tool = await isolated(Floods, timeout=30)
    try:
        iid = await tool.create()
        result = await tool.call(iid, {})
        assert result.status == "ok" and len(result.response.text) == 1 << 20
    finally:
        await tool.close()
    out, err = capfd.readouterr()
    assert "x" * 1000 in err and "x" * 1000 not in out  # the worker's prints go to stderr


async def test_isolation_from_a_tools_config_and_its_errors():
    tools = await build_tools(parse_tools_config({"tools": [
        {"class_name": "faulty_tools.Echo", "config": {"isolation": "process", "timeout": 7}}]}))
    try:
        assert isinstance(tools["echo"], ProcessTool) and tools["echo"].timeout == 7
        toolset = ToolSet(tools, {"echo": ToolKwargs(create_kwargs={"reward": 2})})
        await toolset.start()
        assert (await toolset.call(ToolCall(name="echo", arguments={"x": 5}))).response.text.startswith("echo 5")
        assert await toolset.finish() == {"echo": 2.0}
    finally:
        await tools["echo"].close()
    with pytest.raises(ToolConfigError, match="config.isolation: expected 'none' or 'process'"):
        await build_tools(parse_tools_config({"tools": [
            {"class_name": "faulty_tools.Echo", "config": {"isolation": "container"}}]}))
    with pytest.raises(ToolConfigError, match="Local is defined inside a function"):
        await ProcessTool.start(_local_tool(), ISOLATED, None)


def _local_tool():
    class Local(Echo):
        pass

    return Local


def test_cli_tool_call_with_process_isolation():
    out = run_toolrl("tool", "call", "calculator", '{"expression": "6*7"}', "--config", '{"isolation": "process"}')
    assert out.returncode == 0 and out.stdout.strip() == "42", out.stderr


async def test_config_errors_inside_the_worker_are_config_errors():
    from toolrl_calculator.tool import CalculatorTool

    with pytest.raises(ToolConfigError, match="config.no_such_option"):
        await ProcessTool.start(CalculatorTool, {**ISOLATED, "no_such_option": 1}, None)
    with pytest.raises(ToolConfigError, match="not supported by Echo"):
        Echo(ISOLATED)  # a tool built in the parent (a custom from_config) cannot claim isolation


async def test_the_tool_config_loader_chooses_isolation_not_the_tool_class():
    """Tool.from_config builds in this process only; the loader (verl_config) starts the worker. So
    toolrl.tools needs nothing of toolrl.tools.isolation, which imports it: no import cycle."""
    import ast
    import inspect

    import toolrl.tools

    with pytest.raises(ToolConfigError, match="a tool config .* builds it in a worker process"):
        await Echo.from_config(ISOLATED, None, {})
    imported = {n.module for n in ast.walk(ast.parse(inspect.getsource(toolrl.tools)))
                if isinstance(n, ast.ImportFrom)}
    assert "toolrl.tools.isolation" not in imported
