"""The trainer group as the controller sees it (:class:`toolrl.roles.TrainerGroup`): step, push weights,
save, load, close.

:class:`LocalTrainer` is one :class:`~toolrl.roles.trainer_rank.TrainerRank` in the controller's process
(no Ray; it pushes into the in-process engine, which shares its module). :class:`RayTrainerGroup` is
``world_size`` ranks as Ray actors in one placement group (:mod:`toolrl.roles.ray_actors`), joined by a
``torch.distributed`` process group. Every call goes to all ranks at once; a rank that dies or fails
ends the call with :class:`TrainerFailed`, which names the rank and what it was doing, and the other
ranks are killed rather than left waiting in a collective.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

from toolrl.config import Config, ConfigError
from toolrl.roles import WeightPush
from toolrl.roles.ray_actors import ActorDied, Placement, result
from toolrl.roles.trainer_rank import TrainerRank
from toolrl.trajectory import Trajectory


class TrainerFailed(RuntimeError):
    """A trainer rank died or raised; the message is one line naming the rank and the step."""


class LocalTrainer:
    def __init__(self, rank: TrainerRank) -> None:
        self.rank = rank

    async def step(self, trajectories: Sequence[Trajectory], step: int) -> dict[str, Any]:
        return await asyncio.to_thread(self.rank.step, trajectories)

    async def push(self, targets: Sequence[Any], version: int | None = None) -> WeightPush:
        """The weights to engines in this process (``targets``), each taking all buckets between the
        same two decode steps and, with them, the label ``version`` (None: its own). In a thread: the
        push waits for each engine's running step. An engine here cannot die: nothing comes back dead."""
        def push() -> dict[str, float]:
            with contextlib.ExitStack() as updating:
                for engine in targets:
                    updating.enter_context(engine.updating_weights(engine.weight_version if version is None else version))
                return self.rank.push_to_engines(targets, self.rank.config.trainer.weight_sync_bucket_mb)

        return WeightPush(await asyncio.to_thread(push))

    async def save(self, directory: str, step: int) -> None:
        await asyncio.to_thread(self.rank.save, directory)

    async def load(self, directory: str) -> None:
        await asyncio.to_thread(self.rank.load, directory)

    def close(self) -> None:
        self.rank.close()


class RayTrainerGroup:
    """``config.trainer.world_size`` ranks on the Ray cluster this process is connected to, packed onto
    as few nodes as hold them."""

    def __init__(self, config: Config) -> None:
        import ray

        self.config = config
        n = config.trainer.world_size
        self.placement = Placement.reserve(f"trainer.world_size={n}", "rank", n, config.ray.num_cpus_per_trainer,
                                           config.ray.num_gpus_per_trainer, "PACK")
        payload = config.model_dump()
        self.ranks: list[Any] = [
            ray.remote(TrainerRank).options(**self.placement.options(r)).remote(payload, r, n) for r in range(n)]
        self.infos: list[dict[str, Any]] = []

    async def start(self, timeout_s: float = 900.0) -> list[dict[str, Any]]:
        await self.placement.ready(timeout_s)
        master = await self._all([self.ranks[0].address.remote()], "start-up") if len(self.ranks) > 1 else [None]
        self.infos = await self._all([r.setup.remote(master[0]) for r in self.ranks], "start-up")
        return self.infos

    async def step(self, trajectories: Sequence[Trajectory], step: int) -> dict[str, Any]:
        import ray

        ref = ray.put(list(trajectories))
        results = await self._all([r.step.remote(ref) for r in self.ranks], f"step {step}")
        return {**results[0], "trainer_state_mb": max(r["trainer_state_mb"] for r in results)}

    async def push(self, targets: Sequence[Any], version: int | None = None) -> WeightPush:
        """Weights to the rollout-worker actors ``targets`` (also while they generate), labelled
        ``version`` (None: the workers keep their label); rank 0 sends, every rank gathers."""
        bucket_mb = self.config.trainer.weight_sync_bucket_mb
        results = await self._all([r.push_weights.remote(list(targets), bucket_mb, version) for r in self.ranks],
                                  "weight sync")
        return WeightPush({"weight_sync_s": results[0]["weight_sync_s"],
                           "weight_sync_peak_mb": max(r["weight_sync_peak_mb"] for r in results)},
                          [targets[i] for i in results[0]["dead"]])

    async def save(self, directory: str, step: int) -> None:
        await self._all([r.save.remote(directory) for r in self.ranks], f"checkpoint of step {step}")

    async def load(self, directory: str) -> None:
        await self._all([r.load.remote(directory) for r in self.ranks], "resume")

    def close(self) -> None:
        import ray

        refs = [r.close.remote() for r in self.ranks]
        with contextlib.suppress(Exception):
            ray.wait(refs, num_returns=len(refs), timeout=10)
        for r in self.ranks:
            with contextlib.suppress(Exception):
                ray.kill(r, no_restart=True)
        with contextlib.suppress(Exception):
            self.placement.remove()

    async def _all(self, refs: Sequence[Any], what: str) -> list[Any]:
        """Every rank's result; the first rank to die or raise ends the call (no waiting for the
        others, which may be blocked in a collective with it)."""
        from ray.exceptions import RayTaskError

        futures = [asyncio.ensure_future(result(ref)) for ref in refs]
        try:
            await asyncio.wait(futures, return_when=asyncio.FIRST_EXCEPTION)
            for rank, fut in enumerate(futures):
                if fut.done() and fut.exception() is not None:
                    exc = fut.exception()
                    where = self._where(rank)
                    if isinstance(exc, ActorDied):
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
