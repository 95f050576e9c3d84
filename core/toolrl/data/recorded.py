"""Training on recorded trajectories instead of generating them (``data.trajectories``): token-exact
rows in the layout of ``rollouts/step_NNNNN.jsonl`` (``toolrl serve --record`` writes them for every
served conversation, or a run's own traces), grouped and scored as docs/evaluation.md says.

Every group becomes one :class:`~toolrl.schemas.Sample` carrying its trajectories, so the controller
draws batches of groups exactly as it draws prompts; :class:`toolrl.processes.replay.Replay` hands them
to the trainer in place of the rollout group's generations. Every problem is found before any model
loads and is one line naming the file, the row's line and the field.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
from collections.abc import Hashable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pydantic import ValidationError

from toolrl.agent_roles import check_row_role
from toolrl.config import Config, ConfigError, format_errors, resolve_path
from toolrl.data import existing, read_rows
from toolrl.rewards import scoring
from toolrl.rewards.scoring import RewardFunctions
from toolrl.schemas import Sample
from toolrl.trajectory import Trajectory

# A log-probability is at most 0; an engine's log-softmax may round a near-certain token a hair above it.
LOGPROB_ROUNDING = 1e-4


def _trajectory(row: dict[str, Any], origin: str, vocab_size: int | None = None) -> Trajectory:
    """The row as a trajectory the trainer can take: what would fail inside the trainer, or train
    silently wrong (a mask of 2 weighs a token twice), is a one-line error here."""
    try:
        traj = Trajectory.model_validate({"group": 0, "sample_index": 0, **row})
    except ValidationError as exc:
        raise ConfigError(f"{origin}: {format_errors(exc)}") from None
    n = len(traj.response_ids)
    if len(traj.response_mask) != n or len(traj.logprobs) != n:
        raise ConfigError(f"{origin}: response_ids, response_mask and logprobs differ in length "
                          f"({n}, {len(traj.response_mask)}, {len(traj.logprobs)})")
    if not traj.prompt_ids:
        raise ConfigError(f"{origin}: prompt_ids: empty (a trajectory starts from its prompt)")
    if (mask := next((m for m in traj.response_mask if m not in (0, 1)), None)) is not None:
        raise ConfigError(f"{origin}: response_mask: each value is 1 (a model token, trained) or 0, got {mask}")
    if not any(traj.response_mask):
        raise ConfigError(f"{origin}: response_mask: no model token to train on")
    if (logprob := next((lp for lp in traj.logprobs if not lp <= LOGPROB_ROUNDING), None)) is not None:
        raise ConfigError(f"{origin}: logprobs: a log-probability is at most 0, got {logprob}")
    for field in ("prompt_ids", "response_ids"):
        bad = next((i for i in getattr(traj, field) if i < 0 or (vocab_size is not None and i >= vocab_size)), None)
        if bad is not None:
            within = f"0 to {vocab_size - 1}: vocab_size in its config.json" if vocab_size is not None else "from 0"
            raise ConfigError(f"{origin}: {field}: token id {bad} is outside the model's vocabulary ({within})")
    return traj


def _reward(traj: Trajectory, row: dict[str, Any], rewards: RewardFunctions, origin: str) -> list[Any] | None:
    """Sets the row's own reward; else starts the configured reward functions on its final response
    and returns their values (awaitables from async functions: :func:`_score_all` settles them)."""
    if row.get("reward") is not None:
        reward = row["reward"]
        if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
            raise ConfigError(f"{origin}: reward: must be a finite number, got {reward!r}")
        traj.reward = float(reward)
        return None
    if not rewards:
        raise ConfigError(f"{origin}: reward: the row has none, and no reward functions (reward.functions "
                          "or the environment's) score it")
    sample = Sample(prompt=[], ground_truth=row.get("ground_truth"), data_source=row.get("data_source") or "")
    traj.error, traj.reward_errors = None, {}
    return scoring.start_rewards(rewards, traj, sample)


def _score_all(config: Config, rewards: RewardFunctions, pending: list[tuple[Trajectory, list[Any], str]]) -> None:
    """Every row's reward from its functions' values; async ones (a judge) are awaited together, on a
    loop of their own in a worker thread (this runs while a run is being resolved, maybe inside a loop)."""
    values = [v for _, vs, _ in pending for v in vs]
    if any(inspect.isawaitable(v) for v in values):
        with ThreadPoolExecutor(1) as pool:
            values = pool.submit(asyncio.run, scoring.settle(values, config.reward.timeout_s)).result()
    at = 0
    for traj, vs, origin in pending:
        scoring.combine(rewards, config.reward, traj, values[at:at + len(vs)], [r.step_reward for r in traj.tool_results])
        at += len(vs)
        if traj.error is not None:
            raise ConfigError(f"{origin}: reward: {traj.error}")


def load_groups(config: Config, rewards: list[tuple[str, float, Any]], vocab_size: int | None = None) -> list[Sample]:
    """One sample per group of the rows in ``data.trajectories``; its ``trajectories`` are scored
    with ``rewards`` (the resolved reward functions) where a row carries no reward. ``vocab_size``: the
    model's, which every token id must be below (None: not known)."""
    groups: dict[Hashable, list[Trajectory]] = {}
    pending: list[tuple[Trajectory, list[Any], str]] = []
    for name in config.data.trajectories:
        path = existing(resolve_path(config, name), "data.trajectories")
        for origin, row in read_rows(path):  # the data files' reader: its limits and one-line errors
            if not isinstance(row, dict):
                raise ConfigError(f"{origin}: a row must be a JSON object, got {type(row).__name__}")
            traj = _trajectory(row, origin, vocab_size)
            # Before any weights load, not at the step that meets it.
            check_row_role(config, f"{origin}: role", traj.role, traj.role is not None and bool(config.roles), True)
            if (values := _reward(traj, row, rewards, origin)) is not None:
                pending.append((traj, values, origin))
            # A group number means something within its own file only (each trace file numbers from 0).
            key = ("group", str(path), json.dumps(row["group"])) if "group" in row else ("prompt", tuple(traj.prompt_ids))
            groups.setdefault(key, []).append(traj)
    if not groups:
        raise ConfigError(f"data.trajectories: no rows in {', '.join(config.data.trajectories)}")
    _score_all(config, rewards, pending)
    return [Sample(prompt=[], index=g, ground_truth=trajs[0].ground_truth, trajectories=trajs)
            for g, trajs in enumerate(groups.values())]
