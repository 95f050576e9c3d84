"""The agent path: with ``rollout.agent`` a program runs each episode instead of the turn loop; its
model calls go through the gateway (toolrl.gateway), which records them as the trajectory, scored
as any other."""

from __future__ import annotations

import contextlib
from contextlib import AbstractAsyncContextManager
from typing import Any

from toolrl.agent_roles import first_role
from toolrl.gateway.record import EpisodeRecord
from toolrl.gateway.run import run_agent_episode
from toolrl.gateway.session import GatewaySession
from toolrl.rollout.reward import score_pieces
from toolrl.rollout.rollout_context import RolloutContext, Route
from toolrl.schemas import Sample
from toolrl.trajectory import Trajectory


async def run_agent_trajectory(ctx: RolloutContext, route: Route, sample: Sample, group: int, trajectory_id: str,
                               seed: int, slot: AbstractAsyncContextManager[Any] | None = None) -> list[Trajectory]:
    """One episode of the route's agent program (toolrl.gateway.run), scored as any trajectory: the
    reward functions on its last answer, its step rewards, and the rewards the program gave (the
    episode's, and each role's)."""
    assert route.agent is not None
    model = route.agent.options.model
    if ctx.roles and model not in ctx.roles:  # a run with roles serves them: the row's, else the first
        model = first_role(sample, ctx.roles)
    session = GatewaySession(EpisodeRecord(trajectory_id, sample.index or 0, group, sample.env, sample.ground_truth),
                             ctx.engine, ctx.schema_renderer, route.parser, ctx.config, seed, model, ctx.roles,
                             ctx.adapters)
    async with slot or contextlib.nullcontext():
        outcome = await run_agent_episode(await ctx.gateway(), session, route.agent, sample,
                                          bool(route.reward_functions))
    *closed, traj = outcome.pieces
    return await score_pieces(route, sample, closed, traj, outcome.step_rewards, outcome.terms, outcome.role_rewards)
