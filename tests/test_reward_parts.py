"""A reward function returning named parts (a rubric) gives one reward term per part."""

from __future__ import annotations

import asyncio
import math

from toolrl.config import RewardConfig
from toolrl.rollout import Route, Trajectory, score
from toolrl.schemas import Message, Sample


def _score(fn, weight: float = 1.0) -> Trajectory:
    route = Route(tools={}, max_turns=1, parser=None, reward_functions=[("rubric", weight, fn)],
                  reward_config=RewardConfig())
    traj = Trajectory(trajectory_id="t", sample_index=0, group=0, prompt_ids=[1], model_text=["a", "b"],
                      final_response="b")
    asyncio.run(score(route, traj, Sample(prompt=[Message(role="user", content="q")]), []))
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
