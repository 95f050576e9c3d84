"""Where each process runs, decided once per run: :func:`start_processes` builds the trainer group and the
rollout group in this process (no ``ray.address``; the in-process engine shares the trainer's module,
or keeps its own copy when rollouts overlap training) or as Ray actors, this process then keeping only
the data, the tokenizer and the records. :class:`Processes` is what the controller
(:mod:`toolrl.processes.controller`) and evaluation (:mod:`toolrl.processes.evaluate`) drive."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from toolrl.config import Config
from toolrl.processes import RolloutGroup, TrainerGroup, sync_weights
from toolrl.processes.in_process import build_local_run
from toolrl.processes.resolve import ResolvedRun, resolve_run
from toolrl.processes.rollout_workers import RolloutWorkerPool
from toolrl.processes.run_check import ModelInputs, check_model_inputs
from toolrl.processes.trainer_group import LocalTrainer, RayTrainerGroup
from toolrl.processes.trainer_rank import TrainerRank
from toolrl.ray_cluster import init_ray


@dataclass
class Processes:
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
            raise RuntimeError("processes composed without a trainer group (train=False)")
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


async def start_processes(source: ResolvedRun | Config, train: bool = True,
                          inputs: ModelInputs | None = None) -> Processes:
    """Build each process where it runs, from a resolved run (a bare config is resolved here first) and
    the model's inputs checked before any model loads (checked here when not given).
    Without Ray: one process, the engine sharing the trainer's module (a run that does not train
    builds no trainer: the engine loads what it needs). With Ray: this process builds
    no model and no engine; the trainer ranks and the rollout workers compose their own parts in
    their own processes."""
    run: ResolvedRun = (source if isinstance(source, ResolvedRun)
                        else resolve_run(source, "train" if train else "rollout"))
    config = run.config
    if inputs is None:
        inputs = check_model_inputs(config, run.parts, run.model_dir, run.prompts)
    if config.ray.address is None:
        local = await build_local_run(config, run.parts, run.prompts, run.model_dir, inputs, run.plan, train)
        processes = Processes(config, local.tokenizer, local.path, local.rollouts)
        if train:
            rank = TrainerRank(config, plan=run.plan)
            processes.trainer = LocalTrainer(rank)
            processes.placement = {"trainer": [rank.setup(model=local.model, tokenizer=local.tokenizer)]}
        return processes

    import ray

    owns_ray = not ray.is_initialized()
    if owns_ray:
        init_ray(config.ray.address, config.ray.num_rollout_workers * config.ray.num_cpus_per_worker
                 + (config.trainer.world_size * config.ray.num_cpus_per_trainer if train else 0))
    try:
        pool = RolloutWorkerPool(
            config, config.ray.num_rollout_workers, config.ray.address,
            num_cpus_per_worker=config.ray.num_cpus_per_worker, num_gpus_per_worker=config.ray.num_gpus_per_worker,
            plan=run.plan)
    except BaseException:
        if owns_ray:
            ray.shutdown()
        raise
    processes = Processes(config, inputs.tokenizer, run.model_dir, pool, pool=pool, owns_ray=owns_ray)
    try:
        starts = [pool.start()]
        if train:
            trainer = RayTrainerGroup(config, run.plan)
            processes.trainer = pool.slots.weights_from = trainer  # a replacement worker's first weights come from it
            starts.append(trainer.start())
        placed = await asyncio.gather(*starts)
        processes.placement = {"rollout_workers": placed[0], **({"trainer": placed[1]} if train else {})}
    except BaseException:
        await processes.close()
        raise
    return processes
