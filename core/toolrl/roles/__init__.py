"""The processes as the controller sees them: a :class:`TrainerGroup` and a :class:`RolloutGroup`, whichever
implementation runs them (in this process or as Ray actors; :mod:`toolrl.roles.start` decides), and the
weight sync between them (:func:`sync_weights`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from toolrl.schemas import Sample
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
    (:class:`~toolrl.roles.trainer_group.LocalTrainer`) or ``trainer.world_size`` Ray actors
    (:class:`~toolrl.roles.trainer_group.RayTrainerGroup`)."""

    @property
    def world_size(self) -> int:
        """The ranks the group has now (fewer than ``trainer.world_size`` after a shrink)."""
        ...

    def take_recoveries(self) -> list[dict[str, Any]]:
        """The group's recoveries from dead ranks since the last call, one row each for
        ``recoveries.jsonl`` (:class:`toolrl.roles.recovery.Recovery`)."""
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


@runtime_checkable
class RolloutGroup(Protocol):
    """The engines and the agent loop around them: in this process
    (:class:`~toolrl.roles.in_process.Rollouts`), as Ray actors
    (:class:`~toolrl.roles.rollout_workers.RolloutWorkerPool`), or recorded groups standing in for
    them (:class:`~toolrl.roles.replay.Replay`)."""

    @property
    def generating(self) -> RolloutGroup:
        """The group whose engines generate: itself, or the one a stand-in answers for."""
        ...

    async def run(self, samples: Sequence[Sample], n: int, seed: int, id_prefix: str = "") -> list[Trajectory]:
        """``n`` trajectories per sample, what ``run_rollouts`` gives them as one batch."""
        ...

    async def run_group(self, sample: Sample, group: int, n: int, seed: int, id_prefix: str = "") -> list[Trajectory]:
        """Group ``group`` alone (streaming): what a batch gives that group."""
        ...

    async def check_trainable(self) -> str | None:
        """None when training may use the engines, else a one-line reason."""
        ...

    async def ready(self) -> None:
        """Every engine up and holding the weights last sent (a replaced worker gets the trainer's now):
        what a batch that must not start on other weights waits for (``one_step_off``)."""
        ...

    def weight_targets(self, version: int) -> list[Any]:
        """Where weights ``version`` go now (engines, or worker actors that are up); the group
        records ``version`` first, for workers that come up later."""
        ...

    def replace(self, dead: Sequence[Any]) -> None:
        """Replace the targets ``dead`` (found dead by a weight push)."""
        ...

    def take_recoveries(self) -> list[dict[str, Any]]:
        """The replaced workers that came up since the last call, one row each for ``recoveries.jsonl``
        (``index`` and ``worker``: which one, and where its replacement runs)."""
        ...

    async def close(self) -> None:
        ...


async def sync_weights(trainer: TrainerGroup, rollouts: RolloutGroup, version: int) -> dict[str, float]:
    """The weight sync, driven from the controller: the trainer pushes weights ``version`` (steps
    trained) to the rollout group's live engines, and the ones found dead are replaced (a replacement
    gets the weights once up, before it runs anything). Returns ``weight_sync_s`` and
    ``weight_sync_peak_mb``."""
    pushed = await trainer.push(rollouts.weight_targets(version), version)
    rollouts.replace(pushed.dead)
    return pushed.metrics


