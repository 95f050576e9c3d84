"""Each role's figures in a step's metrics row (``role/NAME/...``): its reward over the episodes it acted
in (its posted reward, else the episode's), its success and its trained tokens; none in a run with no roles."""

import math

from toolrl.agent_roles import role_metrics, role_tokens
from toolrl.data.batches import zero_variance
from toolrl.run_dir import rollout_metrics
from toolrl.trajectory import Trajectory


def piece(key, k, role, reward=0.0, last=False, tokens=2, **fields):
    return Trajectory(trajectory_id=key if last else f"{key}/piece{k}", trajectory_key=key, piece=k, sample_index=0,
                      group=0, prompt_ids=[1], response_ids=[5] * (tokens + 1), response_mask=[1] * tokens + [0],
                      logprobs=[0.0] * (tokens + 1), reward=reward, role=role,
                      termination="answered" if last else "forked", **fields)


def test_each_role_has_its_reward_success_and_trained_tokens():
    # Episode a: the solver twice (2 + 4 tokens; b adds 2) then the verifier, reward 1, the verifier's posted 0.
    # Episode b: solver then verifier, reward 0, the verifier's 1. Episode c: the verifier alone, reward NaN.
    a = [piece("a", 0, "solver", 1.0, role_rewards={"verifier": 0.0}),
         piece("a", 1, "solver", 1.0, tokens=4, role_rewards={"verifier": 0.0}),
         piece("a", 2, "verifier", 1.0, last=True, role_rewards={"verifier": 0.0})]
    b = [piece("b", 0, "solver", 0.0, role_rewards={"verifier": 1.0}),
         piece("b", 1, "verifier", 0.0, last=True, role_rewards={"verifier": 1.0}, error="boom")]
    c = [piece("c", 0, "verifier", math.nan, last=True)]
    roles = role_metrics(a + b + c, success_threshold=1.0)
    # The verifier's rewards: 0 (a), 1 (b), NaN (c, left out of the mean); b's verifier succeeded but b
    # ended in an error.
    assert roles == {"role/solver/reward": 0.5, "role/solver/success": 0.5,
                     "role/verifier/reward": 0.5, "role/verifier/success": 0.0}
    assert role_tokens(a + b + c) == {"role/solver/trained_tokens": 8.0, "role/verifier/trained_tokens": 6.0}
    assert "role/solver/success" not in role_metrics(a)  # no success notion: not reported


def test_a_run_without_roles_has_no_role_figures():
    plain = [piece("a", 0, None, 1.0, last=True)]
    assert role_metrics(plain, success_threshold=1.0) == {} and role_tokens(plain) == {}
    assert not [k for k in rollout_metrics(plain, 1.0) if k.startswith("role/")]


def test_a_group_whose_roles_rewards_differ_is_not_counted_as_teaching_nothing():
    # Both episodes have reward 1, but the verifier's posted rewards differ: its baseline gives advantages.
    differ = [piece("a", 0, "verifier", 1.0, last=True, role_rewards={"verifier": 0.0}),
              piece("b", 0, "verifier", 1.0, last=True, role_rewards={"verifier": 1.0})]
    same = [piece("a", 0, "verifier", 1.0, last=True, role_rewards={"verifier": 1.0}),
            piece("b", 0, "verifier", 1.0, last=True, role_rewards={"verifier": 1.0})]
    assert rollout_metrics(differ, 1.0)["equal_reward_groups"] == 0
    assert rollout_metrics(same, 1.0)["equal_reward_groups"] == 1
    assert not zero_variance(differ) and zero_variance(same)  # algorithm.skip_zero_variance_groups keeps it
