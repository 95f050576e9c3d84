"""Recorded groups standing in for the rollout group (``data.trajectories``): the trainer trains on
what :func:`toolrl.data.recorded.load_groups` read instead of on generations."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from toolrl.schemas import Sample
from toolrl.trajectory import Trajectory, prefixed_id

if TYPE_CHECKING:
    from toolrl.processes import RolloutGroup


class Replay:
    """A rollout group (:class:`toolrl.processes.RolloutGroup`) answered from recorded groups: a batch of
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
        return [t.model_copy(deep=True, update={"trajectory_id": prefixed_id(id_prefix, t.trajectory_id),
                                                "group": group, "sample_index": sample.index or 0}) for t in trajs]

    async def check_trainable(self) -> str | None:
        return None  # recorded rows carry token ids and the engine's logprobs

    async def ready(self) -> None:
        """Recorded groups need no engine."""

    def weight_targets(self, version: int) -> list[Any]:
        return self.generating.weight_targets(version)

    def replace(self, dead: Sequence[Any]) -> None:
        self.generating.replace(dead)

    def take_recoveries(self) -> list[dict[str, Any]]:
        return self.generating.take_recoveries()

    async def close(self) -> None:
        await self.generating.close()
