"""The processes as the controller sees them: a :class:`TrainerGroup` and a :class:`RolloutGroup`, whichever
implementation runs them (in this process or as Ray actors; :mod:`toolrl.processes.start` decides), and the
weight sync between them (:func:`sync_weights`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from toolrl.data.batches import RolloutGroup as RolloutGroup  # its home: the batches that read it

if TYPE_CHECKING:
    from toolrl.trajectory import Trajectory


@dataclass
class WeightPush:
    """What a weight sync gives back: its ``metrics`` (``weight_sync_s``, ``weight_sync_peak_mb``) and
    the targets found dead on the way (the handles given to :meth:`TrainerGroup.push`)."""

    metrics: dict[str, float]
    dead: list[Any] = field(default_factory=list)


@runtime_checkable
class TrainerGroup(Protocol):
    """The trainer ranks as the controller drives them: one in this process
    (:class:`~toolrl.processes.trainer_group.LocalTrainer`) or ``trainer.world_size`` Ray actors
    (:class:`~toolrl.processes.trainer_group.RayTrainerGroup`)."""

    @property
    def world_size(self) -> int:
        """The ranks the group has now (fewer than ``trainer.world_size`` after a shrink)."""
        ...

    def take_recoveries(self) -> list[dict[str, Any]]:
        """The group's recoveries from dead ranks since the last call, one row each for
        ``recoveries.jsonl`` (:class:`toolrl.processes.recovery.Recovery`)."""
        ...

    async def step(self, trajectories: Sequence[Trajectory], step: int) -> dict[str, Any]:
        """One GRPO step on the whole batch (``step``: 1-based, for errors); the group's metrics, and
        for the traces: under ``advantages`` each trajectory's advantage, under ``trainer_logprobs``
        (by trajectory id) each trained trajectory's log-probs under the weights the step started from."""
        ...

    async def push(self, targets: Sequence[Any], version: int | None = None) -> WeightPush:
        """The current weights to ``targets`` (from :meth:`RolloutGroup.weight_targets`), labelled
        ``version`` (None: each target keeps its label)."""
        ...

    async def save(self, directory: str, step: int) -> None:
        """Every rank's part of a checkpoint into ``directory``."""
        ...

    async def load(self, directory: str) -> None:
        """A checkpoint written by any number of ranks."""
        ...

    def close(self) -> None:
        ...


async def sync_weights(trainer: TrainerGroup, rollouts: RolloutGroup, version: int) -> dict[str, float]:
    """The weight sync, driven from the controller: the trainer pushes weights ``version`` (steps
    trained) to the rollout group's live engines, and the ones found dead are replaced (a replacement
    gets the weights once up, before it runs anything). Returns ``weight_sync_s`` and
    ``weight_sync_peak_mb``."""
    pushed = await trainer.push(rollouts.weight_targets(version), version)
    rollouts.replace(pushed.dead)
    return pushed.metrics
