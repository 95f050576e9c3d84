"""Per-role baselines: in a run with roles each role's reward (``role_rewards``, else the episode's) is
normalised over its group's episodes apart from the other roles', and every piece of a role gets its
role's number; a run with no roles gets the advantages it always had, bit for bit."""

import math

import pytest
import torch
from toolrl.algorithms import AdvantageInputs, build_estimator
from toolrl.config import AlgorithmConfig
from toolrl.training.step import token_advantages
from toolrl.trajectory import Trajectory


def piece(key, k, role, reward, role_rewards=None, group=0, tokens=3):
    return Trajectory(trajectory_id=f"{key}/piece{k}", trajectory_key=key, piece=k, sample_index=group, group=group,
                      prompt_ids=[1],
                      response_ids=[5] * tokens, response_mask=[1] * tokens, logprobs=[0.0] * tokens,
                      reward=reward, role=role, role_rewards=role_rewards or {})


def episodes():
    """One group of three episodes, a solver and a verifier in each. Solver rewards (the episode's):
    1, 0, 1. Verifier rewards (posted for the role): 0, 1, 1. Episode c's solver acts twice."""
    return [piece("a", 0, "solver", 1.0, {"verifier": 0.0}), piece("a", 1, "verifier", 1.0, {"verifier": 0.0}),
            piece("b", 0, "solver", 0.0, {"verifier": 1.0}), piece("b", 1, "verifier", 0.0, {"verifier": 1.0}),
            piece("c", 0, "solver", 1.0), piece("c", 1, "verifier", 1.0), piece("c", 2, "solver", 1.0)]


def per_row(grid):
    return grid[:, 0].tolist()


def test_each_roles_reward_is_normalised_over_the_groups_episodes_apart_worked_by_hand():
    algo = AlgorithmConfig(advantage="grpo")
    grid = token_advantages(episodes(), build_estimator(algo), 8, algo)
    # Each role: rewards {1, 0, 1} over the three episodes (c counted once), mean 2/3, unbiased std
    # sqrt(((1/3)² + (2/3)² + (1/3)²) / 2) = sqrt(1/3); the reward 1 gets (1/3) / (sqrt(1/3) + eps), 0 gets
    # -(2/3) / (sqrt(1/3) + eps).
    up, down = (1 / 3) / (math.sqrt(1 / 3) + 1e-6), -(2 / 3) / (math.sqrt(1 / 3) + 1e-6)
    #                       a.solver a.verifier b.solver b.verifier c.solver c.verifier c.solver
    assert per_row(grid) == pytest.approx([up, down, down, up, up, up, up], abs=1e-6)
    assert torch.equal(grid, grid[:, :1].expand(grid.shape))  # one number over each piece


def test_dr_grpo_centres_each_role_on_its_own_mean():
    algo = AlgorithmConfig(advantage="dr_grpo")
    grid = token_advantages(episodes(), build_estimator(algo), 8, algo)
    assert per_row(grid) == pytest.approx([1 / 3, -2 / 3, -2 / 3, 1 / 3, 1 / 3, 1 / 3, 1 / 3], abs=1e-6)


def test_groups_stay_apart_within_a_role():
    algo = AlgorithmConfig(advantage="dr_grpo")
    trajs = [piece("a", 0, "solver", 1.0), piece("b", 0, "solver", 0.0),
             piece("c", 0, "solver", 5.0, group=1), piece("d", 0, "solver", 3.0, group=1)]
    assert per_row(token_advantages(trajs, build_estimator(algo), 8, algo)) == pytest.approx([0.5, -0.5, 1, -1])


@pytest.mark.parametrize("advantage", ["grpo", "dr_grpo", "rloo", "reinforce_pp_baseline"])
def test_a_run_without_roles_gets_the_same_advantages_bit_for_bit(advantage):
    """Without roles: each episode once with its reward, against its whole group, as before; and a run
    whose pieces all name one role (no role rewards) gets those same numbers."""
    algo = AlgorithmConfig(advantage=advantage)
    estimator = build_estimator(algo)
    plain = [p.model_copy(update={"role": None, "role_rewards": {}}) for p in episodes()]
    plain += [piece(f"s{k}", 0, None, r, group=1, tokens=2 + k) for k, r in enumerate((0.0, 0.5, 2.0))]
    for p in plain[-3:]:
        p.trajectory_key = ""  # a trajectory of one piece has no key: its row stands for it
    grid = token_advantages(plain, estimator, 8, algo)
    # The reference: the estimator on one row per episode (its first piece), groups and rewards as given.
    rows = [plain[i] for i in (0, 2, 4, 7, 8, 9)]
    mask = torch.zeros((len(rows), max(len(p.response_ids) for p in plain)))
    for n, p in enumerate(rows):
        mask[n, :len(p.response_mask)] = torch.tensor(p.response_mask, dtype=torch.float32)
    ref = estimator(AdvantageInputs(torch.tensor([p.reward for p in rows], dtype=torch.float64),
                                    torch.tensor([p.group for p in rows]), mask))
    of = {p.trajectory_key or p.trajectory_id: ref[n, 0] for n, p in enumerate(rows)}
    assert torch.equal(grid[:, 0], torch.stack([of[p.trajectory_key or p.trajectory_id] for p in plain]))
    one_role = [p.model_copy(update={"role": "solver"}) for p in plain]
    assert torch.equal(token_advantages(one_role, estimator, 8, algo), grid)


def test_a_roles_reward_is_decided_in_agent_roles_alone():
    """The rule "a role's own reward, else the episode's" is one function (agent_roles.role_reward): the
    baselines and the step's figures both call it, no other module of core reads a role's reward itself."""
    import ast
    from pathlib import Path

    import toolrl

    core = Path(toolrl.__file__).parent
    readers = sorted(str(p.relative_to(core)) for p in core.rglob("*.py") for node in ast.walk(ast.parse(p.read_text()))
                     if isinstance(node, ast.Attribute) and node.attr == "get"
                     and isinstance(node.value, ast.Attribute) and node.value.attr == "role_rewards")
    assert readers == ["agent_roles.py"]
