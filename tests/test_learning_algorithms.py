"""Every built-in advantage estimator with every built-in policy loss learns the aligned-token task of
``test_trainer.test_grpo_learns_a_learnable_task``, with its model, prompts, seeds (0) and budget
(16 steps × 16 trajectories): the mean reward of the last 4 steps beats that of the first 2 by 0.1.

The estimators that do not divide by a standard deviation (``dr_grpo``, ``rloo``) give advantages about
as large as the rewards' spread within a group (~0.1 here, against ~1 for the normalised ones), so
their runs take a 10× learning rate: the same step size, not an easier test."""

import itertools
import os

import pytest
from test_learning_async import run
from test_trainer import peaked_tiny_model  # noqa: F401  (a fixture, used by name)

ESTIMATORS = ("grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline")
LOSSES = ("ppo_clip", "gspo", "cispo")
UNNORMALISED = {"dr_grpo", "rloo"}
# CI runs a covering set (every estimator and every loss at least once, ~20 s each on CPU): the default pair,
# grpo with ppo_clip, is the synchronous run of test_learning_async (test_trainer's
# test_grpo_learns_a_learnable_task), so it is not run twice; the whole matrix with TOOLRL_ALL_PAIRS=1 (15
# runs, ~15 min).
COVERING = [("dr_grpo", "gspo"), ("rloo", "cispo"), ("reinforce_pp", "gspo"), ("reinforce_pp_baseline", "cispo")]
PAIRS = list(itertools.product(ESTIMATORS, LOSSES)) if os.environ.get("TOOLRL_ALL_PAIRS") else COVERING


@pytest.mark.slow
@pytest.mark.parametrize(("advantage", "loss"), PAIRS)
def test_every_builtin_pair_raises_the_mean_reward(tmp_path, peaked_tiny_model, advantage, loss,  # noqa: F811
                                                   record_property):
    lr = "5.0e-2" if advantage in UNNORMALISED else "5.0e-3"
    rows = run(tmp_path, peaked_tiny_model, 0, extra=[f"algorithm.advantage={advantage}", f"algorithm.loss={loss}",
                                                      f"optim.lr={lr}"])
    rewards = [r["reward_mean"] for r in rows]
    first, last = sum(rewards[:2]) / 2, sum(rewards[-4:]) / 4
    record_property("first_2", first)  # for the table of docs/algorithms.md (--junitxml)
    record_property("last_4", last)
    assert last > first + 0.1, (advantage, loss, rewards)
    assert all("advantage_mean" in r and "advantage_std" in r for r in rows)
