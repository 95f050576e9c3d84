"""Where each role runs, decided once per run: :func:`compose_roles` builds the trainer group and the
rollout group in this process (no ``ray.address``; the in-process engine shares the trainer's module,
or keeps its own copy when rollouts overlap training) or as Ray actors, this process then keeping only
the data, the tokenizer and the records. :class:`Roles` is what the controller (:mod:`toolrl.roles.controller`)
and evaluation (:mod:`toolrl.roles.evaluate`) drive."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from toolrl.config import Config

if TYPE_CHECKING:
    from toolrl.roles.resolve import ResolvedRun


@dataclass
class Roles:
    """What the controller drives. ``trainer``: a LocalTrainer or a RayTrainerGroup (None when only
    evaluating); ``rollouts``: in-process Rollouts or a RolloutWorkerPool."""

    config: Config
    tokenizer: Any
    model_dir: str
    rollouts: Any
    trainer: Any = None
    pool: Any = None  # the RolloutWorkerPool when rollouts run on Ray
    owns_ray: bool = False
    placement: dict[str, Any] = field(default_factory=dict)

    async def sync_weights(self, version: int) -> dict[str, float]:
        """The trainer's weights (``version``: steps trained) to every engine; returns
        ``weight_sync_s`` and ``weight_sync_peak_mb``."""
        if self.pool is None:
            return await self.trainer.sync(version)
        return await self.pool.push_weights(version)

    async def close(self) -> None:
        try:
            if self.trainer is not None:
                self.trainer.close()
            if self.pool is not None:
                self.pool.close()
            else:
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
    from toolrl.roles.compose import compose_local
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
            roles.trainer = LocalTrainer(rank, local.engine)
            roles.placement = {"trainer": [rank.setup(model=local.model, tokenizer=local.tokenizer)]}
        return roles

    import ray

    from toolrl.roles.rollout_workers import RolloutWorkerPool, init_ray

    path = run.model_dir
    tokenizer = models.load_tokenizer(path)
    check_prompt_tokens(run.prompts or [], tokenizer, path, "the prompts")  # before any actor starts
    owns_ray = not ray.is_initialized()
    if owns_ray:
        init_ray(config.ray.address, config.ray.num_rollout_workers * config.ray.num_cpus_per_worker
                 + (config.trainer.world_size * config.ray.num_cpus_per_trainer if train else 0))
    roles = Roles(config, tokenizer, path, None, owns_ray=owns_ray)
    try:
        roles.pool = roles.rollouts = RolloutWorkerPool(
            config, config.ray.num_rollout_workers, config.ray.address,
            num_cpus_per_worker=config.ray.num_cpus_per_worker, num_gpus_per_worker=config.ray.num_gpus_per_worker)
        starts = [roles.pool.start()]
        if train:
            roles.trainer = RayTrainerGroup(config)
            roles.pool.weight_source = roles.trainer.push
            starts.append(roles.trainer.start())
        placed = await asyncio.gather(*starts)
        roles.placement = {"rollout_workers": placed[0], **({"trainer": placed[1]} if train else {})}
    except BaseException:
        await roles.close()
        raise
    return roles
