"""Every way a tool can misbehave comes back as an error result (never an exception, never a late
``ok``), and nothing a tool returns can put a non-finite number into rewards or metrics."""

import asyncio
import logging
import time

import pytest
from faulty_tools import (
    BlocksLoop,
    Echo,
    HangsAsync,
    IgnoresCancel,
    NanReward,
    Raises,
    Returns,
    SyncSleeps,
)
from toolrl.schemas import ToolCall, ToolKwargs
from toolrl.tools import ToolSet


async def one_call(tool, arguments=None, **execute_kwargs):
    iid = await tool.create()
    try:
        return await tool.call(iid, arguments or {}, **execute_kwargs)
    finally:
        await tool.release(iid)


@pytest.mark.parametrize("value, message", [
    ("int", "execute must return (response, step_reward, metrics), got int 7"),
    ("bytes", "got bytes b'raw'"),
    ("bare_string", "got str 'no tuple'"),
    ("pair", "got a 2-tuple"),
    ("text_reward", "step_reward must be a number, got str 'high'"),
    ("nan_reward", "step_reward must be finite, got nan"),
    ("inf_reward", "step_reward must be finite, got inf"),
    ("list_metrics", "metrics must be a dict with str keys, got list"),
    ("nan_metric", "metrics must hold JSON values and finite numbers"),
    ("object_metric", "metrics must hold JSON values and finite numbers"),
    ("int_response", "response must be a str or a ToolResponse, got int 5"),
])
async def test_wrong_return_values_become_error_results(value, message):
    result = await one_call(Returns(), value=value)
    assert result.status == "error" and result.response.is_error
    assert result.response.text.startswith("Error: tool 'returns' returned an invalid result: ")
    assert message in result.response.text
    assert result.step_reward == 0.0 and result.metrics == {}


async def test_an_exception_is_an_error_result():
    result = await one_call(Raises())
    assert result.status == "error" and "RuntimeError: kaboom" in result.response.text


async def test_a_hanging_async_tool_times_out_on_time():
    start = time.perf_counter()
    result = await one_call(HangsAsync())
    assert result.status == "timeout" and "timed out after 0.5 s" in result.response.text
    assert time.perf_counter() - start < 1.5


async def test_ignoring_cancellation_is_still_a_timeout_on_time(caplog):
    start = time.perf_counter()
    result = await one_call(IgnoresCancel(), sleep_s=2.0)
    assert result.status == "timeout"  # not "ok", and not seconds late
    assert time.perf_counter() - start < 1.5
    with caplog.at_level(logging.WARNING, logger="toolrl.tools"):
        await asyncio.sleep(4.0)  # the tool carries on after cancellation and finishes
    assert any("ignored cancellation" in r.getMessage() and "ignores_cancel" in r.getMessage()
               for r in caplog.records)


async def test_blocking_the_event_loop_is_a_timeout_named_in_logs_and_results(caplog):
    with caplog.at_level(logging.WARNING, logger="toolrl.tools"):
        result = await one_call(BlocksLoop(), block_s=1.6)
    assert result.status == "timeout" and "held the event loop for 1.6 s" in result.response.text
    assert result.loop_blocked_s >= 1.5
    messages = [r.getMessage() for r in caplog.records]
    # The watchdog names the tool while it still holds the loop, then the total is logged.
    assert any("blocks_loop" in m and "still holds it" in m for m in messages), messages
    assert any("blocks_loop" in m and "blocked the event loop for 1.6" in m for m in messages), messages


async def test_a_well_behaved_call_reports_no_blocking():
    result = await one_call(Echo(), {"x": 1})
    assert result.status == "ok" and result.loop_blocked_s == 0.0


async def test_plain_def_execute_runs_in_a_thread_under_the_timeout():
    tool = SyncSleeps()
    iid = await tool.create()
    start = time.perf_counter()
    slow, fast, ticks = await asyncio.gather(
        tool.call(iid, {}, sleep_s=3.0),
        tool.call(iid, {}, sleep_s=0.05),
        _ticks(0.4),
    )
    assert slow.status == "timeout" and time.perf_counter() - start < 1.5
    assert fast.status == "ok" and fast.response.text == "slept 0.05"
    assert ticks >= 3, "the event loop was blocked while the thread slept"
    assert (await tool.call("never-created", {})).status == "error"  # state() raising, from the thread


async def _ticks(duration: float) -> int:
    n, end = 0, time.perf_counter() + duration
    while time.perf_counter() < end:
        await asyncio.sleep(0.02)
        n += 1
    return n


async def test_toolset_rejects_non_finite_calc_reward_and_still_releases():
    tool = NanReward()
    released = []
    original = tool.release

    async def release(iid, **kw):
        released.append(iid)
        await original(iid, **kw)

    tool.release = release
    toolset = ToolSet({"nan_reward": tool})
    await toolset.start()
    assert (await toolset.call(ToolCall(name="nan_reward", arguments={}))).status == "ok"
    rewards = await toolset.finish()
    assert rewards == {} and released
    assert toolset.finish_errors == {"nan_reward": "calc_reward: calc_reward must be finite, got nan"}


async def test_toolset_contains_faulty_lifecycle_methods():
    class BadCreate(Echo):
        schema = Echo.schema

        def create(self, instance_id=None, **kw):  # a plain def, and it returns no id
            return 42

    class SlowRelease(Echo):
        async def release(self, instance_id, **kw):
            time.sleep(0.3)  # blocks the loop: counted, but within the lifecycle timeout
            await super().release(instance_id)

    toolset = ToolSet({"bad": BadCreate(), "slow": SlowRelease(tool_schema=_renamed("slow"))},
                      {"slow": ToolKwargs(create_kwargs={"reward": 2})}, lifecycle_timeout=5)
    await toolset.start()
    assert toolset.create_errors == {"bad": "create must return the instance id (a str), got int"}
    unavailable = await toolset.call(ToolCall(name="bad", arguments={}))
    assert unavailable.status == "error" and "unavailable" in unavailable.response.text
    assert await toolset.finish() == {"slow": 2.0}


def _renamed(name):
    schema = {**Echo.schema, "function": {**Echo.schema["function"], "name": name}}
    return schema


def test_cli_tool_call_goes_through_the_same_driver(tmp_path):
    import json
    from pathlib import Path

    from _dists import run_toolrl

    (tmp_path / "tools.yaml").write_text(
        "tools:\n"
        "  - class_name: faulty_tools.NanReward\n"
        "  - class_name: faulty_tools.IgnoresCancel\n"
        "    config: {timeout: 0.3}\n")
    here = Path(__file__).resolve().parent
    nan = run_toolrl("tool", "call", "nan_reward", "{}", "--tools-config", str(tmp_path / "tools.yaml"), "--json",
                     path=here)
    out = json.loads(nan.stdout)
    assert nan.returncode == 1 and out["status"] == "ok" and out["reward"] is None
    assert out["error"] == "calc_reward: calc_reward must be finite, got nan"
    stubborn = run_toolrl("tool", "call", "ignores_cancel", "{}", "--tools-config", str(tmp_path / "tools.yaml"),
                          path=here)
    assert stubborn.returncode == 1 and "timed out after 0.3 s" in stubborn.stderr
