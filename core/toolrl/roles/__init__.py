"""Where each role runs, decided once per run: :func:`compose_roles` builds the trainer group and the
rollout group in this process (no ``ray.address``; the in-process engine shares the trainer's module,
or keeps its own copy when rollouts overlap training) or as Ray actors, this process then keeping only
the data, the tokenizer and the records. :class:`Roles` is what the controller (:mod:`toolrl.roles.controller`)
and evaluation (:mod:`toolrl.roles.evaluate`) drive: a :class:`TrainerGroup` and a :class:`RolloutGroup`,
whichever implementation runs them, and the weight sync between them (:func:`sync_weights`)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from toolrl.config import Config

if TYPE_CHECKING:
    from toolrl.roles.resolve import ResolvedRun
    from toolrl.roles.rollout_workers import RolloutWorkerPool
    from toolrl.rollout import Trajectory
    from toolrl.schemas import Sample


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

    async def step(self, trajectories: Sequence[Trajectory], step: int) -> dict[str, Any]:
        """One GRPO step on the whole batch (``step``: 1-based, for errors); the group's metrics, and
        under ``advantages`` each trajectory's advantage for the traces."""
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
    (:class:`~toolrl.roles.compose.Rollouts`), as Ray actors
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

    def weight_targets(self, version: int) -> list[Any]:
        """Where weights ``version`` go now (engines, or worker actors that are up); the group
        records ``version`` first, for workers that come up later."""
        ...

    def replace(self, dead: Sequence[Any]) -> None:
        """Replace the targets ``dead`` (found dead by a weight push)."""
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


@dataclass
class Roles:
    """What the controller drives. ``trainer``: None when only evaluating; ``pool``: the rollout group
    when it runs on Ray (``rollouts`` may be a stand-in for it)."""

    config: Config
    tokenizer: Any
    model_dir: str
    rollouts: RolloutGroup
    trainer: TrainerGroup | None = None
    pool: RolloutWorkerPool | None = None
    owns_ray: bool = False
    placement: dict[str, Any] = field(default_factory=dict)

    @property
    def training(self) -> TrainerGroup:
        """The trainer group, for the controller's training steps, saves and loads."""
        if self.trainer is None:
            raise RuntimeError("roles composed without a trainer group (train=False)")
        return self.trainer

    async def sync_weights(self, version: int) -> dict[str, float]:
        """The trainer's weights (``version``: steps trained) to every engine (:func:`sync_weights`)."""
        return await sync_weights(self.training, self.rollouts, version)

    async def close(self) -> None:
        try:
            if self.trainer is not None:
                self.trainer.close()
            await self.rollouts.close()
        finally:
            if self.owns_ray:
                import ray

                ray.shutdown()


async def compose_roles(run: ResolvedRun | Config, train: bool = True) -> Roles:
    """Build each role where it runs, from a resolved run (a bare config is resolved here first).
    Without Ray: one process, the engine sharing the trainer's module. With Ray: this process builds
    no model and no engine; the trainer ranks and the rollout workers compose their own parts in
    their own processes."""
    from toolrl import models
    from toolrl.data import check_prompt_tokens
    from toolrl.roles.compose import compose_local, engine_processor
    from toolrl.roles.resolve import ResolvedRun, resolve_run
    from toolrl.roles.trainer_group import LocalTrainer, RayTrainerGroup
    from toolrl.roles.trainer_rank import TrainerRank

    if not isinstance(run, ResolvedRun):
        run = resolve_run(run, "train" if train else "rollout")
    config = run.config
    if config.ray.address is None:
        local = await compose_local(config, run.parts, run.prompts, run.model_dir)
        roles = Roles(config, local.tokenizer, local.path, local.rollouts)
        if train:
            rank = TrainerRank(config)
            roles.trainer = LocalTrainer(rank)
            roles.placement = {"trainer": [rank.setup(model=local.model, tokenizer=local.tokenizer)]}
        return roles

    import ray

    from toolrl.roles.rollout_workers import RolloutWorkerPool, init_ray

    path = run.model_dir
    tokenizer = models.load_tokenizer(path)
    # Before any actor starts: images need an engine that takes them, and every prompt must fit.
    processor = engine_processor(config, run.parts.engine_cls, path, run.prompts or [])
    check_prompt_tokens(run.prompts or [], tokenizer, path, processor, "the prompts", config.rollout.images)
    owns_ray = not ray.is_initialized()
    if owns_ray:
        init_ray(config.ray.address, config.ray.num_rollout_workers * config.ray.num_cpus_per_worker
                 + (config.trainer.world_size * config.ray.num_cpus_per_trainer if train else 0))
    try:
        pool = RolloutWorkerPool(
            config, config.ray.num_rollout_workers, config.ray.address,
            num_cpus_per_worker=config.ray.num_cpus_per_worker, num_gpus_per_worker=config.ray.num_gpus_per_worker)
    except BaseException:
        if owns_ray:
            ray.shutdown()
        raise
    roles = Roles(config, tokenizer, path, pool, pool=pool, owns_ray=owns_ray)
    try:
        starts = [pool.start()]
        if train:
            trainer = RayTrainerGroup(config)
            roles.trainer = pool.weights_from = trainer  # a replacement worker's first weights come from it
            starts.append(trainer.start())
        placed = await asyncio.gather(*starts)
        roles.placement = {"rollout_workers": placed[0], **({"trainer": placed[1]} if train else {})}
    except BaseException:
        await roles.close()
        raise
    return roles
