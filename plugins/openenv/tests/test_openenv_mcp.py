"""Against a real OpenEnv MCP tool environment (tests/envs/ledger_env.py, built with the openenv
package): tools listed by the server, calls over the wire, the reward, 64 isolated sessions."""

from __future__ import annotations

import asyncio

import pytest
from support import build, close_all, trajectory
from toolrl.tools import ToolConfigError


async def test_the_servers_tools_with_its_schemas(ledger) -> None:
    tools = await build({"base_url": ledger.base_url})
    try:
        assert sorted(tools) == ["balance", "deposit"]
        deposit = tools["deposit"].tool_schema.function
        assert deposit.parameters["properties"] == {"amount": {"type": "integer"}}
        assert "balance" in deposit.description
    finally:
        await close_all(tools)


async def test_calls_go_over_the_wire_and_the_reward_is_the_last_observations(ledger) -> None:
    tools = await build({"base_url": ledger.base_url})
    try:
        results, rewards, toolset = await trajectory(
            tools, [("deposit", {"amount": 4}), ("balance", {}), ("deposit", {"amount": 6}), ("balance", {})],
            create_kwargs={"target": 10})
        assert [r.response.text for r in results[:3]] == ["4", "4", "10"]
        assert [r.metrics["reward"] for r in results[:3]] == [0.0, 0.0, 1.0] and results[2].metrics["done"]
        # done: the episode refuses further steps
        assert results[3].status == "error" and "episode is over" in results[3].response.text
        assert rewards == {"deposit": 1.0, "balance": 0.0}  # the trajectory's reward, given once
        assert not toolset.create_errors and not toolset.finish_errors
        bad = await trajectory(tools, [("deposit", {"amount": "x"})])
        assert bad[0][0].status == "invalid_arguments"  # checked against the server's schema
    finally:
        await close_all(tools)


async def test_64_concurrent_sessions_stay_isolated(ledger) -> None:
    # Generous deadlines: 64 WebSocket handshakes at once on a loaded 2-core machine are slow.
    tools = await build({"base_url": ledger.base_url, "connect_timeout_s": 120, "message_timeout_s": 120},
                        timeout=240)
    try:
        async def one(i: int):
            # reached at the last call for even i (reward 1), one short for odd i (reward 0)
            target = 2 * (i + 1) + i % 2
            return await trajectory(tools, [("deposit", {"amount": i + 1}), ("balance", {}),
                                            ("deposit", {"amount": i + 1})],
                                    create_kwargs={"target": target}, trajectory_id=f"t{i}",
                                    lifecycle_timeout=240)

        runs = await asyncio.gather(*(one(i) for i in range(64)))
        for i, (results, rewards, toolset) in enumerate(runs):
            assert [r.status for r in results] == ["ok"] * 3, (i, results)
            assert [r.response.text for r in results] == [str(i + 1), str(i + 1), str(2 * (i + 1))], \
                f"session {i} saw another session's state"
            assert rewards["deposit"] == (1.0 if i % 2 == 0 else 0.0)
            assert not toolset.create_errors and not toolset.finish_errors
        assert len(tools["deposit"].binding.sessions.open) == 0  # every session closed at release
    finally:
        await close_all(tools)


async def test_bad_blocks_are_config_errors(tmp_path) -> None:
    with pytest.raises(ToolConfigError, match="either base_url"):
        await build({})
    with pytest.raises(ToolConfigError, match="cannot list its tools"):
        await build({"base_url": "http://127.0.0.1:9", "message_timeout_s": 2})
    with pytest.raises(ToolConfigError, match="openenv.yaml"):
        await build({"app_dir": str(tmp_path)})
