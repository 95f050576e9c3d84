"""The per-turn fields of :class:`toolrl.algorithms.AdvantageInputs`, built from the trajectories'
turn records (``Trajectory.turn_starts`` and ``turn_states``, written by toolrl.rollout.turns) for a
turn-level estimator (``needs_turns``, e.g. ``gigpo``).

A turn's positions run from its start to the next turn's start (its generated tokens, then the
observation that answers it, untrained), the last turn's to the end of the response. A turn earns
the step rewards of the calls it made (``ToolResult.step_reward``: a tool's, or a session step's),
as reported; the rest of the trajectory's reward, its outcome, goes to its last turn, so a
trajectory's turn rewards sum to its reward. Each piece of a forked trajectory is a sequence of its
own (as for every per-token estimator): its own turns, the step rewards of those, the outcome on its
last turn.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from toolrl.trajectory import Trajectory

__all__ = ["turn_fields", "turn_rewards"]


def turn_rewards(traj: Trajectory, reward: float) -> tuple[float, ...]:
    """What each of ``traj``'s turns earned: its calls' step rewards, and the rest of ``reward`` on
    the last turn. The piece's turns are the last ``len(turn_starts)`` of ``traj.turns`` (the turn
    numbers its calls' results carry); a closed piece, whose results stay on the live one, has none."""
    count = len(traj.turn_starts)
    first = traj.turns - count + 1
    steps = [0.0] * count
    for result in traj.tool_results:
        if 0 <= result.turn - first < count:
            steps[result.turn - first] += result.step_reward
    if count:
        steps[-1] += reward - sum(steps)
    return tuple(steps)


def turn_fields(trajectories: Sequence[Trajectory], rewards: Sequence[float],
                width: int) -> tuple[torch.Tensor, tuple[tuple[str, ...], ...], tuple[tuple[float, ...], ...]]:
    """``turn_ids`` (B, ``width``), ``turn_states`` and ``turn_rewards`` of the batch (module
    docstring), ``rewards`` the rows' rewards as the estimator sees them (shaped). A row that trains
    tokens but records no turns (an agent program's, or one saved before turns were recorded) is a
    ValueError: its turns cannot be credited."""
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
    states = tuple(tuple(t.turn_states) for t in trajectories)
    earned = tuple(turn_rewards(t, r) for t, r in zip(trajectories, rewards, strict=True))
    return ids, states, earned
