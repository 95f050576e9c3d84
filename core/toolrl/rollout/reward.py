"""A finished trajectory scored (toolrl.rewards.scoring): the route's reward functions on its last
piece, with its step rewards and extra terms (a session's score, an agent program's reward); every
piece before it is trained with the same reward."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from toolrl.rewards import scoring
from toolrl.rollout.rollout_context import Route
from toolrl.schemas import Sample
from toolrl.trajectory import Trajectory


async def score_pieces(route: Route, sample: Sample, closed: Sequence[Trajectory], traj: Trajectory,
                       step_rewards: Sequence[float], terms: Mapping[str, float],
                       role_rewards: Mapping[str, float] | None = None) -> list[Trajectory]:
    """The trajectory's pieces in order, ``traj`` (scored here) last, each with its reward (and the
    rewards given to roles, ``role_rewards``)."""
    await scoring.score(route.reward_functions, route.reward_config, traj, sample, step_rewards, extra=terms)
    traj.role_rewards = dict(role_rewards or {})
    for piece in closed:
        piece.reward, piece.reward_terms = traj.reward, dict(traj.reward_terms)
        piece.reward_errors, piece.role_rewards = dict(traj.reward_errors), dict(traj.role_rewards)
    return [*closed, traj]
