"""Scoring (toolrl.rewards.scoring): named parts, one mechanism for reward functions and tools."""

from __future__ import annotations

import asyncio
import math

import pytest
from toolrl.config import RewardConfig
from toolrl.rewards.scoring import RewardValueError, named_parts, score
from toolrl.schemas import Message, Sample
from toolrl.tools import Tool, ToolSet
from toolrl.trajectory import Trajectory


def _score(fn, weight: float = 1.0) -> Trajectory:
    traj = Trajectory(trajectory_id="t", sample_index=0, group=0, prompt_ids=[1], model_text=["a", "b"],
                      final_response="b")
    asyncio.run(score([("rubric", weight, fn)], RewardConfig(), traj, Sample(prompt=[Message(role="user", content="q")]),
                      []))
    return traj


def test_parts_become_terms_and_sum_to_the_reward():
    seen = {}

    def rubric(response, ground_truth, **info):
        seen.update(info)
        return {"correct": 0.75, "format": 0.25}

    traj = _score(rubric, weight=2.0)
    assert traj.reward_terms == {"rubric.correct": 1.5, "rubric.format": 0.5}
    assert traj.reward == 2.0 and traj.error is None
    assert seen["model_text"] == ["a", "b"]


def test_a_non_finite_part_scores_zero_and_is_reported():
    traj = _score(lambda response, ground_truth, **info: {"correct": math.nan})
    assert traj.reward == 0.0 and traj.reward_terms == {"rubric": 0.0}
    assert "reward rubric" in traj.error and "'correct'" in traj.error


def test_a_reward_with_its_parts_beside_it_reports_them_without_summing():
    traj = _score(lambda response, ground_truth, **info: {"reward": 1.0, "db": 1.0, "action": 0.0}, weight=0.5)
    assert traj.reward_terms == {"rubric": 0.5} and traj.reward == 0.5
    assert traj.reward_parts == {"rubric.db": 1.0, "rubric.action": 0.0}


def test_weighted_rewards_that_overflow_are_not_trained_on():
    traj = Trajectory(trajectory_id="t", sample_index=0, group=0, prompt_ids=[1])
    asyncio.run(score([("huge", 10.0, lambda response, ground_truth, **info: 1e308)], RewardConfig(), traj,
                      Sample(prompt=[{"role": "user", "content": "x"}]), []))
    assert traj.reward == 0.0 and "reward is not finite" in traj.error


@pytest.mark.parametrize(("value", "expected"), [
    (0.5, (0.5, {}, False)),
    (None, (0.0, {}, False)),
    ({"reward": 2.0, "a": 1.0}, (2.0, {"a": 1.0}, False)),
    ({"a": 1.0, "b": 0.5}, (1.5, {"a": 1.0, "b": 0.5}, True)),
])
def test_named_parts_reads_numbers_and_both_mapping_forms(value, expected):
    assert named_parts(value, "reward") == expected


@pytest.mark.parametrize("value", ["1.0", math.inf, {"reward": math.nan}, {"a": "x"}, [1.0]])
def test_named_parts_rejects_what_is_not_a_finite_number(value):
    with pytest.raises(RewardValueError):
        named_parts(value, "reward")


class _Parts(Tool):
    schema = {"type": "function", "function": {"name": "parts", "description": "d",
                                                 "parameters": {"type": "object", "properties": {}}}}

    def __init__(self, value):
        super().__init__()
        self.value = value

    async def execute(self, instance_id, arguments, **kwargs):
        return "ok", 0.0, {}

    async def calc_reward(self, instance_id, **kwargs):
        return self.value


@pytest.mark.parametrize(("value", "reward", "parts"), [
    ({"reward": 1.0, "db": 1.0}, 1.0, {"parts.db": 1.0}),
    ({"db": 0.25, "action": 0.5}, 0.75, {"parts.db": 0.25, "parts.action": 0.5}),
])
def test_a_tools_calc_reward_is_read_by_the_same_rule(value, reward, parts):
    toolset = ToolSet({"parts": _Parts(value)}, trajectory_id="t")

    async def run():
        await toolset.start()
        return await toolset.finish()

    assert asyncio.run(run()) == {"parts": reward}
    assert toolset.reward_parts == parts and not toolset.finish_errors
