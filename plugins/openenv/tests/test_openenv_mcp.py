"""Against a real OpenEnv MCP tool environment (tests/envs/ledger_env.py, built with the openenv
package), through toolrl's rollout loop and the ``openenv`` session: the episode's tools with the
server's schemas, calls over the wire, ``done`` ending the trajectory, the reward (none when the last
observation has none), tools that differ per episode, 64 isolated episodes, and a server holding
OpenEnv's default single session serving 16 concurrent trajectories."""

from __future__ import annotations

import pytest
from support import ENVS, call, rollout, tokenizer
from toolrl.config import ConfigError

REACH = [call("deposit", amount=4), call("balance"), call("deposit", amount=6), call("balance"), "Done."]


async def test_calls_go_over_the_wire_and_done_ends_the_trajectory(ledger) -> None:
    [t] = await rollout({"base_url": ledger.base_url}, [{"extra_info": {"reset_kwargs": {"target": 10}}}],
                        {"s0-": REACH})
    assert t.error is None and t.termination == "done" and t.turns == 3
    assert [r.response.text for r in t.tool_results] == ["4", "4", "10"]  # the 4th call never ran
    assert [r.metrics for r in t.tool_results] == [{"reward": 0.0}, {"reward": 0.0}, {"reward": 1.0, "done": True}]
    assert t.reward_terms == {"steps": 0.0, "openenv": 1.0} and t.reward == 1.0  # steps: no step rewards
    # The prompt renders the episode's tools with the server's schemas.
    prompt = tokenizer().decode(t.prompt_ids)
    assert '"name": "deposit"' in prompt and '"amount": {"type": "integer"}' in prompt and "bonus" not in prompt


async def test_tools_differ_per_episode_and_no_reward_is_not_zero(ledger) -> None:
    rows = [{"extra_info": {"reset_kwargs": {"target": 10, "bonus": True}}}, {"extra_info": {"reset_kwargs": {}}},
            {"extra_info": {"reset_kwargs": {}}}]
    scripts = {"s0-": [call("deposit", amount=5), call("bonus"), "Done."],
               "s1-": [call("bonus"), call("deposit", amount="x"), call("deposit", amount=1), "Done."],
               "s2-": ["Nothing to do."]}
    with_bonus, without, idle = await rollout({"base_url": ledger.base_url}, rows, scripts)
    assert with_bonus.termination == "done" and [r.response.text for r in with_bonus.tool_results] == ["5", "10"]
    assert '"name": "bonus"' in tokenizer().decode(with_bonus.prompt_ids)
    assert [r.status for r in without.tool_results] == ["unknown_tool", "invalid_arguments", "ok"]
    assert '"name": "bonus"' not in tokenizer().decode(without.prompt_ids)
    assert without.reward_terms["openenv"] == 0.0  # its last observation's reward
    # reset's observation carries no reward, and no step followed: no reward term, not a 0.
    assert idle.error is None and "openenv" not in idle.reward_terms and idle.termination == "answered"


async def test_64_concurrent_episodes_stay_isolated(ledger) -> None:
    # Generous deadlines: 64 WebSocket handshakes at once on a loaded 2-core machine are slow.
    options = {"base_url": ledger.base_url, "connect_timeout_s": 120, "message_timeout_s": 120}
    rows = [{"extra_info": {"reset_kwargs": {"target": 2 * (i + 1) + i % 2}}} for i in range(64)]
    scripts = {f"s{i}-": [call("deposit", amount=i + 1), call("balance"), call("deposit", amount=i + 1), "Done."]
               for i in range(64)}
    trajs = await rollout(options, rows, scripts)
    for i, t in enumerate(trajs):  # reached at the last call for even i (done), one short for odd i
        assert [r.response.text for r in t.tool_results] == [str(i + 1), str(i + 1), str(2 * (i + 1))], \
            f"episode {i} saw another episode's state"
        assert t.error is None and t.reward == (1.0 if i % 2 == 0 else 0.0)
        assert t.termination == ("done" if i % 2 == 0 else "answered")


@pytest.mark.timeout(600)
async def test_a_server_of_one_session_queues_sixteen_trajectories() -> None:
    # OpenEnv's default capacity (max_concurrent_envs=1), max_sessions unset: the first refusal says 1/1.
    rows = [{"extra_info": {"reset_kwargs": {"target": 3}}} for _ in range(16)]
    trajs = await rollout({"app": "ledger_env:single", "app_dir": str(ENVS)}, rows,
                          {"s": [call("deposit", amount=3), "Done."]})
    assert [(t.error, t.termination, t.reward) for t in trajs] == [(None, "done", 1.0)] * 16


async def test_bad_options_are_config_errors(tmp_path) -> None:
    from support import routes

    with pytest.raises(ConfigError, match="either base_url"):
        await routes({})
    with pytest.raises(ConfigError, match="cannot read its /schema"):
        await routes({"base_url": "http://127.0.0.1:9", "message_timeout_s": 2})
    with pytest.raises(ConfigError, match="openenv.yaml"):
        await routes({"app_dir": str(tmp_path)})
