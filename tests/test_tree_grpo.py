"""The ``tree_grpo`` estimator (toolrl.algorithms.tree_grpo): a hand-worked batch of two groups of
trees, the std normalisation, one tree per group (GRPO doubled), the pieces of a forked leaf counted
once, step rewards reaching it through the trajectory's reward, and the refusals of a flat rollout."""

import pytest
import torch
from toolrl.algorithms import AdvantageInputs, build_estimator
from toolrl.algorithms.rules import check_algorithm
from toolrl.algorithms.tree_grpo import TREES
from toolrl.config import AlgorithmConfig, ConfigError, RewardConfig, load_config
from toolrl.plugins.parts import RunFacts
from toolrl.rewards.scoring import combine
from toolrl.schemas import ToolResponse, ToolResult
from toolrl.training.step import token_advantages
from toolrl.trajectory import Trajectory


def tree_grpo(**options):
    algo = AlgorithmConfig(advantage="tree_grpo", advantage_options=options)
    return build_estimator(algo), algo


def leaf(name, group, tree, reward, length=3, key=""):
    return Trajectory(trajectory_id=name, sample_index=group, group=group, prompt_ids=[1, 2], response_ids=[9] * length,
                      response_mask=[1] * length, logprobs=[0.0] * length, reward=reward, tree_id=tree,
                      trajectory_key=key)


def test_a_hand_worked_batch():
    estimator, algo = tree_grpo(norm_by_std=False)
    trajs = [leaf("a", 0, 0, 1.0), leaf("b", 0, 0, 0.0), leaf("c", 0, 0, 1.0), leaf("d", 0, 1, 0.0), leaf("e", 0, 1, 0.0),
             leaf("f", 1, 0, 1.0), leaf("g", 1, 0, 0.0), leaf("h", 1, 1, 1.0)]
    grid = token_advantages(trajs, estimator, 64, algo)
    # Group 0, mean 2/5: inter a .6, b -.4, c .6, d -.4, e -.4.
    #   tree 0 (a, b, c) mean 2/3: intra a 1/3, b -2/3, c 1/3;  tree 1 (d, e) mean 0: intra 0, 0.
    # Group 1, mean 2/3: inter f 1/3, g -2/3, h 1/3.
    #   tree 0 (f, g) mean 1/2: intra f .5, g -.5;  tree 1 (h alone): intra 0.
    expected = [0.6 + 1 / 3, -0.4 - 2 / 3, 0.6 + 1 / 3, -0.4, -0.4, 1 / 3 + 0.5, -2 / 3 - 0.5, 1 / 3]
    assert grid.dtype == torch.float32 and grid.shape == (8, 3)
    torch.testing.assert_close(grid, torch.tensor(expected)[:, None].expand(8, 3), rtol=0, atol=1e-6)


def test_std_normalisation_at_both_levels():
    estimator, algo = tree_grpo(eps=1e-6)
    # One tree of two leaves, rewards 1 and 0: (x - mean) / std = 1/√2 at each level (std unbiased), A = ±√2.
    # A third leaf, another tree of the group, reward 0.5: its tree is a singleton (0), the group's
    # mean is 0.5 and std 0.5, so it gets 0 and the others ±0.5 / (0.5 + eps) from the group.
    half = 0.5 / (0.5 ** 0.5 + 1e-6)
    grid = token_advantages([leaf("a", 0, 0, 1.0), leaf("b", 0, 0, 0.0)], estimator, 64, algo)
    torch.testing.assert_close(grid[:, 0], torch.tensor([2 * half, -2 * half]), rtol=0, atol=1e-6)
    grid = token_advantages([leaf("a", 0, 0, 1.0), leaf("b", 0, 0, 0.0), leaf("c", 0, 1, 0.5)], estimator, 64, algo)
    group = 0.5 / (0.5 + 1e-6)
    torch.testing.assert_close(grid[:, 0], torch.tensor([half + group, -half - group, 0.0]), rtol=0, atol=1e-6)


@pytest.mark.parametrize("norm_by_std", [True, False])
def test_one_tree_per_group_is_grpo_doubled(norm_by_std):
    rewards = [1.0, 0.0, 0.5, 0.2, 0.9, 0.9]
    trajs = [leaf(f"t{i}", i // 3, 7, r) for i, r in enumerate(rewards)]
    grpo = AlgorithmConfig(advantage_options={"norm_by_std": norm_by_std})
    estimator, algo = tree_grpo(norm_by_std=norm_by_std)
    expected = 2 * token_advantages(trajs, build_estimator(grpo), 64, grpo)
    torch.testing.assert_close(token_advantages(trajs, estimator, 64, algo), expected)


def test_the_pieces_of_a_forked_leaf_count_once():
    estimator, algo = tree_grpo(norm_by_std=False)
    # a is cut into two pieces (one trajectory_key): the tree and the group see it once, each piece gets its number.
    pieces = [leaf("a.0", 0, 0, 1.0, key="a"), leaf("a.1", 0, 0, 1.0, key="a"), leaf("b", 0, 0, 0.0, key="b"),
              leaf("c", 0, 1, 0.0, key="c")]
    grid = token_advantages(pieces, estimator, 64, algo)
    # Group mean 1/3: inter a 2/3, b -1/3, c -1/3; tree 0 (a, b) mean .5: a .5, b -.5; tree 1 (c alone): 0.
    torch.testing.assert_close(grid[:, 0], torch.tensor([2 / 3 + 0.5, 2 / 3 + 0.5, -1 / 3 - 0.5, -1 / 3]),
                               rtol=0, atol=1e-6)


def test_step_rewards_reach_it_through_the_reward():
    # A tool's step reward is a term of the trajectory's reward (reward.step_reward_weight · Σ step rewards),
    # which an outcome estimator compares: the leaf whose call earned 0.5 is ahead of its sibling.
    trajs = [leaf("a", 0, 0, 0.0), leaf("b", 0, 0, 0.0)]
    trajs[0].tool_results = [ToolResult(name="t", response=ToolResponse(text="ok"), step_reward=0.5, turn=1)]
    for t in trajs:
        combine([], RewardConfig(step_reward_weight=1.0), t, [], [r.step_reward for r in t.tool_results])
    assert [t.reward for t in trajs] == [0.5, 0.0]
    estimator, algo = tree_grpo(norm_by_std=False)
    torch.testing.assert_close(token_advantages(trajs, estimator, 64, algo)[:, 0], torch.tensor([0.5, -0.5]))


def test_a_flat_rollout_is_refused():
    estimator, algo = tree_grpo()
    with pytest.raises(ConfigError, match="^algorithm.advantage: tree_grpo compares the leaves of each tree, and rollout.tree is unset"):
        estimator.check_run(RunFacts(load_config(None, data={"env": "arithmetic"}), "", {}, {}, None, None))
    with pytest.raises(ValueError, match="a row of a flat rollout has none"):
        token_advantages([leaf("a", 0, None, 1.0), leaf("b", 0, 0, 0.0)], estimator, 64, algo)
    inputs = AdvantageInputs(torch.tensor([1.0], dtype=torch.float64), torch.tensor([0]), torch.ones(1, 2))
    with pytest.raises(ValueError, match="tree_grpo reads each row's tree"):
        estimator(inputs)


def test_a_config_names_tree_grpo_and_its_options():
    def config(*overrides):
        return load_config(None, ["algorithm.advantage=tree_grpo", *overrides], data={"env": "arithmetic"})

    estimator, _ = check_algorithm(config("algorithm.advantage_options={eps: 1.0e-3}"))
    assert estimator.name == "tree_grpo" and estimator.options.eps == 1e-3 and estimator.reads == {TREES}
    assert estimator.outcome  # one number per leaf: a sequence-level loss composes with it
    assert check_algorithm(config("algorithm.loss=gspo"))[0].name == "tree_grpo"
    with pytest.raises(ConfigError, match=r"^override algorithm.advantage_options.eps=0: .*greater than 0"):
        check_algorithm(config("algorithm.advantage_options.eps=0"))
    with pytest.raises(ConfigError, match="advantage_options"):
        check_algorithm(config("algorithm.advantage_options.gamma=0.5"))
