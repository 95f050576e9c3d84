"""The turn fields of the step (:attr:`toolrl.algorithms.AlgorithmPart.reads`), built from the trajectories'
turn records (``Trajectory.turn_starts`` and ``turn_states``, written by toolrl.rollout.turns) for a
turn-level estimator (one that reads :data:`TURNS`, e.g. ``gigpo``, and gives them with :func:`turn_fields`).

A turn's positions run from its start to the next turn's start; it earns its calls' step rewards, and
the last turn the rest of the reward (:func:`turn_rewards`), so a trajectory's turn rewards sum to its
reward (docs/algorithms.md, "gigpo"). Each piece of a forked trajectory is a sequence of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from toolrl.trajectory import Trajectory

if TYPE_CHECKING:
    from toolrl.algorithms import StepField

__all__ = ["TURNS", "TURN_IDS", "TURN_STATES", "TURN_STEP_REWARDS", "turn_fields", "turn_rewards", "turn_step_rewards"]

# ``turn_ids`` (B, R) long: the turn each position belongs to (-1: none); ``turn_states``: each row's tuple of
# the keys of the states its turns started from (the run asks the sessions for them only when the estimator
# reads them); ``turn_step_rewards``: each row's tuple of what its turns' calls earned.
TURN_IDS, TURN_STATES, TURN_STEP_REWARDS = "turn_ids", "turn_states", "turn_step_rewards"
TURNS = frozenset({TURN_IDS, TURN_STATES, TURN_STEP_REWARDS})


def turn_step_rewards(traj: Trajectory) -> tuple[float, ...]:
    """What each of ``traj``'s turns' calls earned (their step rewards). The piece's turns are the last
    ``len(turn_starts)`` of ``traj.turns`` (the turn numbers its calls' results carry); a closed piece,
    whose results stay on the live one, has none."""
    count = len(traj.turn_starts)
    first = traj.turns - count + 1
    steps = [0.0] * count
    for result in traj.tool_results:
        if 0 <= result.turn - first < count:
            steps[result.turn - first] += result.step_reward
    return tuple(steps)


def turn_rewards(steps: Sequence[float], reward: float) -> list[float]:
    """What each turn earned: its step rewards ``steps`` and, on the last turn, the rest of ``reward``."""
    earned = list(steps)
    if earned:
        earned[-1] += reward - sum(earned)
    return earned


def turn_fields(trajectories: Sequence[Trajectory], width: int) -> dict[str, StepField]:
    """The :data:`TURNS` fields of the batch over a response grid of ``width`` columns. A row that trains
    tokens but records no turns (an agent program's, or one saved before turns were recorded) is a
    ValueError: its turns cannot be credited."""
    import torch

    ids = torch.full((len(trajectories), width), -1, dtype=torch.long)
    for i, t in enumerate(trajectories):
        # A turn that generated nothing, at the end of a piece cut after its last model token, starts
        # past the response: it keeps its place in its step group and covers no position.
        starts = [min(s, len(t.response_ids)) for s in t.turn_starts]
        if len(starts) != len(t.turn_states) or starts != sorted(starts) or any(s < 0 for s in starts):
            raise ValueError(f"trajectory {t.trajectory_id}: turn_starts {t.turn_starts} and turn_states must be "
                             "one non-negative, non-decreasing offset and one key per turn")
        if not starts and any(t.response_mask):
            raise ValueError(f"trajectory {t.trajectory_id} records no turns (turn_starts): a turn-level estimator "
                             "needs toolrl's rollout loop to record them; an agent program's trajectories "
                             "(rollout.agent) and ones saved before turns were recorded have none")
        for j, (start, end) in enumerate(zip(starts, [*starts[1:], len(t.response_ids)], strict=True)):
            ids[i, start:end] = j
    return {TURN_IDS: ids, TURN_STATES: tuple(tuple(t.turn_states) for t in trajectories),
            TURN_STEP_REWARDS: tuple(turn_step_rewards(t) for t in trajectories)}
