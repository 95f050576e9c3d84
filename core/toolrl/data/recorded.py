"""Training on recorded trajectories instead of generating them (``data.trajectories``).

The rows are token-exact trajectories in the layout of ``rollouts/step_NNNNN.jsonl``: what
``toolrl serve --record DIR`` writes to ``DIR/trajectories.jsonl`` for every served conversation
(so agents written in other frameworks produce training data), or a run's own traces.

- **Groups** (GRPO's baseline): rows of one file with the same ``group`` value when rows carry one
  (rollout traces), else rows with the same ``prompt_ids`` (served conversations that began alike).
- **Rewards**: a row's ``reward`` when it has one (e.g. written by the agent framework); otherwise
  the configured reward functions (``reward.functions``, else the environment's) score the row's ``final_response`` against its
  ``ground_truth`` (null when absent), as the rollout loop scores a generated trajectory.

Every group becomes one :class:`~toolrl.schemas.Sample` carrying its trajectories, so the controller
draws batches of groups exactly as it draws prompts; :class:`Replay` hands them to the trainer in
place of the rollout group's generations. Every problem is found before any model loads and is one
line naming the file, the row's line and the field.
"""

from __future__ import annotations

import json
import math
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from toolrl.config import Config, ConfigError, format_errors, resolve_path
from toolrl.rollout import Route, Trajectory, score
from toolrl.schemas import Sample

if TYPE_CHECKING:
    from toolrl.roles import RolloutGroup


def _trajectory(row: dict[str, Any], origin: str) -> Trajectory:
    try:
        traj = Trajectory.model_validate({"group": 0, "sample_index": 0, **row})
    except ValidationError as exc:
        raise ConfigError(f"{origin}: {format_errors(exc)}") from None
    n = len(traj.response_ids)
    if len(traj.response_mask) != n or len(traj.logprobs) != n:
        raise ConfigError(f"{origin}: response_ids, response_mask and logprobs differ in length "
                          f"({n}, {len(traj.response_mask)}, {len(traj.logprobs)})")
    if not any(traj.response_mask):
        raise ConfigError(f"{origin}: response_mask: no model token to train on")
    return traj


def _reward(traj: Trajectory, row: dict[str, Any], route: Route, origin: str) -> None:
    """The row's own reward, or the configured reward functions' score of its final response."""
    if row.get("reward") is not None:
        reward = row["reward"]
        if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
            raise ConfigError(f"{origin}: reward: must be a finite number, got {reward!r}")
        traj.reward = float(reward)
        return
    if not route.reward_functions:
        raise ConfigError(f"{origin}: reward: the row has none, and no reward functions (reward.functions "
                          "or the environment's) score it")
    sample = Sample(prompt=[], ground_truth=row.get("ground_truth"), data_source=row.get("data_source") or "")
    traj.error = None
    score(route, traj, sample, [r.step_reward for r in traj.tool_results])
    if traj.error is not None:
        raise ConfigError(f"{origin}: reward: {traj.error}")


def load_groups(config: Config) -> list[Sample]:
    """One sample per group of the rows in ``data.trajectories``; its ``trajectories`` are scored."""
    from toolrl.data import _rows as rows
    from toolrl.roles.compose import build_rewards, configured_envs

    # One environment's rewards (or the explicit reward.functions); a mixture's rows carry no route,
    # so there only reward.functions (or the rows' own rewards) score them.
    envs = list(configured_envs(config).values())
    rewards = build_rewards(config, envs[0].env if len(envs) == 1 else None)
    # Scoring reads only a route's rewards; no tools, parser or turn limit take part.
    route = Route(tools={}, max_turns=1, parser=None, reward_functions=rewards,  # type: ignore[arg-type]
                  reward_config=config.reward)
    groups: dict[Hashable, list[Trajectory]] = {}
    for name in config.data.trajectories:
        path = resolve_path(config, name)
        if not path.exists():
            raise ConfigError(f"data.trajectories: {path} does not exist")
        for origin, row in rows(path):  # the data files' reader: its limits and one-line errors
            if not isinstance(row, dict):
                raise ConfigError(f"{origin}: a row must be a JSON object, got {type(row).__name__}")
            traj = _trajectory(row, origin)
            _reward(traj, row, route, origin)
            # A group number means something within its own file only (each trace file numbers from 0).
            key = ("group", str(path), json.dumps(row["group"])) if "group" in row else ("prompt", tuple(traj.prompt_ids))
            groups.setdefault(key, []).append(traj)
    if not groups:
        raise ConfigError(f"data.trajectories: no rows in {', '.join(config.data.trajectories)}")
    return [Sample(prompt=[], index=g, ground_truth=trajs[0].ground_truth, trajectories=trajs)
            for g, trajs in enumerate(groups.values())]


class Replay:
    """A rollout group (:class:`toolrl.roles.RolloutGroup`) answered from recorded groups: a batch of
    group samples gives their trajectories, numbered by their place in the batch as generated groups
    are. The rollout group it stands in for (``generating``) stays up: the trainer's weights still
    reach its engines, evaluation samples from them, and it closes with this one."""

    def __init__(self, generating: RolloutGroup) -> None:
        self.generating = generating

    async def run(self, samples: Sequence[Sample], n: int, seed: int, id_prefix: str = "") -> list[Trajectory]:
        return [t for g, s in enumerate(samples) for t in await self.run_group(s, g, n, seed, id_prefix)]

    async def run_group(self, sample: Sample, group: int, n: int, seed: int, id_prefix: str = "") -> list[Trajectory]:
        """The recorded group (its own size, whatever ``n``); ``seed`` has nothing left to decide."""
        trajs: list[Trajectory] = getattr(sample, "trajectories", None) or []
        if not trajs:
            raise ValueError(f"sample {sample.index} carries no recorded trajectories")
        return [t.model_copy(deep=True, update={"group": group, "sample_index": sample.index or 0,
                                                "trajectory_id": f"{id_prefix}{t.trajectory_id}"}) for t in trajs]

    async def check_trainable(self) -> str | None:
        return None  # recorded rows carry token ids and the engine's logprobs

    def weight_targets(self, version: int) -> list[Any]:
        return self.generating.weight_targets(version)

    def replace(self, dead: Sequence[Any]) -> None:
        self.generating.replace(dead)

    async def close(self) -> None:
        await self.generating.close()
