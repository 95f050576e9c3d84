"""The trainer group as the controller sees it: step, sync weights, save, load, close.

:class:`LocalTrainer` is one :class:`~toolrl.roles.trainer_rank.TrainerRank` in the controller's process
(no Ray; the in-process engine shares its module). :class:`RayTrainerGroup` is ``world_size`` ranks as
Ray actors in one placement group, joined by a ``torch.distributed`` process group. Every call goes to
all ranks at once; a rank that dies or fails ends the call with :class:`TrainerFailed`, which names the
rank and what it was doing, and the other ranks are killed rather than left waiting in a collective.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

from toolrl.config import Config, ConfigError
from toolrl.roles.trainer_rank import TrainerRank
from toolrl.rollout import Trajectory


class TrainerFailed(RuntimeError):
    """A trainer rank died or raised; the message is one line naming the rank and the step."""


class LocalTrainer:
    def __init__(self, rank: TrainerRank, engine: Any) -> None:
        self.rank, self.engine = rank, engine

    async def step(self, trajectories: Sequence[Trajectory], step: int) -> dict[str, float]:
        return await asyncio.to_thread(self.rank.step, trajectories)

    async def sync(self, version: int) -> dict[str, float]:
        """The weights to the engine as ``version``, all buckets between the same two decode steps
        (in a thread: the push waits for the engine's running step)."""
        def push() -> dict[str, float]:
            with self.engine.updating_weights(version):
                return self.rank.push_to_engine(self.engine, self.rank.config.trainer.weight_sync_bucket_mb)

        return await asyncio.to_thread(push)

    async def save(self, directory: str, step: int) -> None:
        await asyncio.to_thread(self.rank.save, directory)

    async def load(self, directory: str) -> None:
        await asyncio.to_thread(self.rank.load, directory)

    def close(self) -> None:
        self.rank.close()


class RayTrainerGroup:
    """``config.trainer.world_size`` ranks on the Ray cluster this process is connected to."""

    def __init__(self, config: Config) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.config = config
        n = config.trainer.world_size
        bundle = {k: v for k, v in (("CPU", config.ray.num_cpus_per_trainer), ("GPU", config.ray.num_gpus_per_trainer))
                  if v > 0}
        self.pg = placement_group([dict(bundle) for _ in range(n)], strategy="PACK")
        payload = config.model_dump()
        self.ranks = [
            ray.remote(TrainerRank).options(
                num_cpus=config.ray.num_cpus_per_trainer, num_gpus=config.ray.num_gpus_per_trainer, max_restarts=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=r),
            ).remote(payload, r, n)
            for r in range(n)
        ]
        self.infos: list[dict[str, Any]] = []

    async def start(self, timeout_s: float = 900.0) -> list[dict[str, Any]]:
        import ray

        n = self.config.trainer.world_size
        try:
            await asyncio.wait_for(self.pg.ready(), timeout_s)
        except TimeoutError:
            total = ray.cluster_resources()
            raise ConfigError(
                f"trainer.world_size={n} needs {n} bundles of {self.config.ray.num_cpus_per_trainer:g} CPUs and "
                f"{self.config.ray.num_gpus_per_trainer:g} GPUs; the cluster has {total.get('CPU', 0):g} CPUs and "
                f"{total.get('GPU', 0):g} GPUs") from None
        master = await self._all([self.ranks[0].address.remote()], "start-up") if n > 1 else [None]
        self.infos = await self._all([r.setup.remote(master[0]) for r in self.ranks], "start-up")
        return self.infos

    async def step(self, trajectories: Sequence[Trajectory], step: int) -> dict[str, float]:
        import ray

        ref = ray.put(list(trajectories))
        results = await self._all([r.step.remote(ref) for r in self.ranks], f"step {step}")
        return {**results[0], "trainer_state_mb": max(r["trainer_state_mb"] for r in results)}

    async def push(self, workers: Sequence[Any], what: str = "weight sync", version: int | None = None) -> dict[str, Any]:
        """Weights to the rollout-worker actors ``workers`` (also while they generate), labelled
        ``version`` (None: the workers keep their label); dead ones are listed under ``dead``."""
        bucket_mb = self.config.trainer.weight_sync_bucket_mb
        results = await self._all([r.push_weights.remote(list(workers), bucket_mb, version) for r in self.ranks],
                                  what)
        return {"weight_sync_s": results[0]["weight_sync_s"],
                "weight_sync_peak_mb": max(r["weight_sync_peak_mb"] for r in results), "dead": results[0]["dead"]}

    async def save(self, directory: str, step: int) -> None:
        await self._all([r.save.remote(directory) for r in self.ranks], f"checkpoint of step {step}")

    async def load(self, directory: str) -> None:
        await self._all([r.load.remote(directory) for r in self.ranks], "resume")

    def close(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        refs = [r.close.remote() for r in self.ranks]
        with contextlib.suppress(Exception):
            ray.wait(refs, num_returns=len(refs), timeout=10)
        for r in self.ranks:
            with contextlib.suppress(Exception):
                ray.kill(r, no_restart=True)
        with contextlib.suppress(Exception):
            remove_placement_group(self.pg)

    async def _all(self, refs: Sequence[Any], what: str) -> list[Any]:
        """Every rank's result; the first rank to die or raise ends the call (no waiting for the
        others, which may be blocked in a collective with it)."""
        from ray.exceptions import RayActorError, RayTaskError

        futures = [asyncio.ensure_future(_result(ref)) for ref in refs]
        try:
            await asyncio.wait(futures, return_when=asyncio.FIRST_EXCEPTION)
            for rank, fut in enumerate(futures):
                if fut.done() and fut.exception() is not None:
                    exc = fut.exception()
                    where = self._where(rank)
                    if isinstance(exc, RayActorError):
                        raise TrainerFailed(f"trainer rank {rank}{where} died during {what}") from None
                    cause = exc.cause if isinstance(exc, RayTaskError) and exc.cause is not None else exc
                    if isinstance(cause, ConfigError):
                        raise cause
                    first = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
                    raise TrainerFailed(f"trainer rank {rank}{where} failed during {what}: "
                                        f"{type(cause).__name__}: {first}") from None
            return [f.result() for f in futures]
        finally:
            for fut in futures:  # ranks still inside a call are killed by close()
                fut.cancel()

    def _where(self, rank: int) -> str:
        if rank < len(self.infos):
            info = self.infos[rank]
            return f" (pid {info['pid']} on {info['host']})"
        return ""


async def _result(ref: Any) -> Any:
    return await ref
