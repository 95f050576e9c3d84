"""The trainer group as the controller sees it (:class:`toolrl.processes.TrainerGroup`): step, push weights,
save, load, close.

:class:`LocalTrainer` is one :class:`~toolrl.processes.trainer_rank.TrainerRank` in the controller's process
(no Ray; it pushes into the in-process engine, which shares its module). :class:`RayTrainerGroup` is
``world_size`` ranks as Ray actors (:mod:`toolrl.processes.ray_actors`) in one ``torch.distributed``
group. Every call goes to all ranks at once; a rank that fails ends the call with :class:`TrainerFailed`
and the others are killed rather than left waiting in a collective; a rank that dies is
:class:`~toolrl.processes.recovery.RankDied`, after which the group re-forms (docs/recovery.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from toolrl.config import Config
from toolrl.processes import WeightPush
from toolrl.processes.ray_actors import ActorDied, result
from toolrl.processes.recovery import (
    ReformingGroup,
    TrainerFailed,
    actor_died,
    close_ranks,
    every_rank,
    reserve_ranks,
    start_ranks,
)
from toolrl.processes.resolve import RunPlan
from toolrl.processes.trainer_rank import TrainerRank
from toolrl.trajectory import Trajectory
from toolrl.transports import Link, build_transport

__all__ = ["LocalTrainer", "RayTrainerGroup", "TrainerFailed"]


class LocalTrainer:
    def __init__(self, rank: TrainerRank) -> None:
        self.rank = rank
        self.world_size = 1

    def take_recoveries(self) -> list[dict[str, Any]]:
        """None ever: the one rank is this process (its death is the controller's, for --supervise)."""
        return []

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
                return self.rank.push_to_engines(targets)

        return WeightPush(await asyncio.to_thread(push))

    async def save(self, directory: str, step: int) -> None:
        await asyncio.to_thread(self.rank.save, directory)

    async def load(self, directory: str) -> None:
        await asyncio.to_thread(self.rank.load, directory)

    def close(self) -> None:
        self.rank.close()


class RayTrainerGroup(ReformingGroup):
    """``config.trainer.world_size`` ranks on the Ray cluster this process is connected to, packed onto
    as few nodes as hold them (``world_size``: fewer after a ``shrink`` recovery)."""

    def __init__(self, config: Config, plan: RunPlan | None = None) -> None:
        self.config = config
        self.plan = plan  # the run check's, for every rank (a re-formed group's too)
        self.world_size = config.trainer.world_size
        self.placement = reserve_ranks(config.ray, self.world_size)
        self.ranks: list[Any] = self._spawn(self.world_size)
        self.infos: list[dict[str, Any]] = []
        self._init_recovery()
        self.transport = build_transport(config.trainer)  # travels with each sync's calls (picklable)
        self._links: tuple[Any, list[Link]] | None = None  # (who they join, the ranks' links) while valid

    def _spawn(self, world_size: int) -> list[Any]:
        import ray

        payload = self.config.model_dump()
        # "copy": one thread of its own for the in-memory copies (snapshot, hold_copies), which run
        # beside the calls on the step's path (a weight push reads the same tensors; nothing writes them).
        actor = ray.remote(concurrency_groups={"copy": 1})(TrainerRank)
        return [actor.options(**self.placement.options(r)).remote(payload, r, world_size, self.plan)
                for r in range(world_size)]

    async def start(self, timeout_s: float = 900.0) -> list[dict[str, Any]]:
        self.infos = []
        self.infos = await start_ranks(self.ranks, self.placement, timeout_s, "start-up")
        return self.infos

    async def step(self, trajectories: Sequence[Trajectory], step: int) -> dict[str, Any]:
        """The step on every rank, once the copies of the step before are complete; the copies of
        the new state are started, not waited for (:mod:`toolrl.processes.recovery`). A rank that dies on
        the way: the group re-forms from the newest complete copies and runs the step again.
        ``snapshot_s``: how long the last complete copies took; ``snapshot_wait_s``: how long calls
        waited for copies since the last step's figures (the copies' cost to the run)."""
        import ray

        ref = ray.put(list(trajectories))

        async def attempt() -> dict[str, Any]:
            await self._copied()
            results = await self._train(ref, step)
            self._start_copies(step, ref)
            # Each rank kept the trainer log-probs of the trajectories it trained (one rank of a
            # sequence-parallel group): together, the batch's.
            logprobs = {k: v for r in results for k, v in r.get("trainer_logprobs", {}).items()}
            return {**results[0], "trainer_state_mb": max(r["trainer_state_mb"] for r in results),
                    "trainer_logprobs": logprobs}

        out = await self._recovering(f"step {step}", attempt)
        out.update(snapshot_s=self.copy_s, snapshot_wait_s=self.copy_wait_s)
        self.copy_wait_s = 0.0
        return out

    async def push(self, targets: Sequence[Any], version: int | None = None) -> WeightPush:
        """Weights to the rollout-worker actors ``targets`` (also while they generate), labelled
        ``version`` (None: the workers keep their label), over the run's weight transport
        (``trainer.weight_transport``): every rank sends the shards it owns over its own link to all
        ``targets`` at once. A transfer that fails (a worker died or stalled past
        ``trainer.weight_push_timeout_s``; every link ends within it) is made once more, on new links,
        to the workers still alive."""
        targets = list(targets)
        dead: list[Any] = []
        failure = ""
        for _ in range(2):
            live = [t for t in targets if not any(t is d for d in dead)]
            if not live:
                break
            metrics, lost, failure = await self._recovering("weight sync", lambda live=live: self._transfer(live, version))
            dead += lost
            if not failure:
                return WeightPush(metrics, dead)
            self._links = None
        if not failure:
            return WeightPush({"weight_sync_s": 0.0, "weight_sync_peak_mb": 0.0}, dead)
        raise TrainerFailed(f"weight sync over {self.transport.name} failed twice: {failure}")

    async def _transfer(self, targets: list[Any], version: int | None) -> tuple[dict[str, float], list[Any], str]:
        """One transfer over the ranks' links (opened anew when the ranks, the transport or the targets changed):
        the sync's metrics, the targets found dead, and why it failed ("" when it did not)."""
        timeout_s = self.config.trainer.weight_push_timeout_s
        gone = await _gone(targets)  # no link waits out its timeout for a receiver already dead
        targets = [t for t in targets if not any(t is g for g in gone)]
        if not targets:
            return {"weight_sync_s": 0.0, "weight_sync_peak_mb": 0.0}, gone, ""
        joined = (self._generation, id(self.transport), tuple(id(t) for t in targets))  # another transport: new links
        if self._links is None or self._links[0] != joined:
            key = uuid.uuid4().hex[:12]
            self._links = joined, await self._all([r.open_weight_link.remote(self.transport, key, len(targets), timeout_s)
                                                   for r in self.ranks], "weight sync")
        links = self._links[1]
        receives = [asyncio.ensure_future(result(t.receive_weights.remote(self.transport, links, i, version), t))
                    for i, t in enumerate(targets)]
        try:
            sent = await self._all([r.send_weights.remote(self.config.trainer.weight_sync_bucket_mb)
                                    for r in self.ranks], "weight sync")
            done, _ = await asyncio.wait(receives, timeout=timeout_s)
        finally:
            for fut in receives:
                fut.cancel()
        dead = gone + [t for t, fut in zip(targets, receives, strict=True)
                       if fut not in done or isinstance(fut.exception(), ActorDied)]
        errors = [r["error"] for r in sent if r.get("error")]
        errors += [str(f.exception()) for f in receives if f in done and f.exception() is not None]
        metrics = {k: max(r[k] for r in sent) for k in ("weight_sync_s", "weight_sync_peak_mb")}
        return metrics, dead, errors[0].splitlines()[0] if errors else ("a worker did not finish" if dead else "")

    async def save(self, directory: str, step: int) -> None:
        async def attempt() -> None:
            await self._copied()  # a rank that dies now is recovered from before the checkpoint is started
            shutil.rmtree(directory, ignore_errors=True)  # a re-formed group writes the whole checkpoint again
            Path(directory).mkdir(parents=True)
            await self._all([r.save.remote(directory) for r in self.ranks], f"checkpoint of step {step}")

        await self._recovering(f"checkpoint of step {step}", attempt)

    async def load(self, directory: str) -> None:
        self._discard_copies()
        await self._all([r.load.remote(directory) for r in self.ranks], "resume")
        self.copies, self.loaded, self.pending = None, directory, None  # a re-formed group starts from here

    def close(self) -> None:
        self._discard_copies()
        close_ranks(self.ranks, self.placement)

    async def _all(self, refs: Sequence[Any], what: str) -> list[Any]:
        return await every_rank(refs, what, self.infos)


# How long a weight sync waits for its targets to say they are alive: a dead actor's call fails at once,
# and one that does not answer in time (stalled) is left to the transfer's timeout.
PING_S = 5.0


async def _gone(targets: Sequence[Any]) -> list[Any]:
    """The rollout-worker actors among ``targets`` that are already dead, asked together."""
    pings = [asyncio.ensure_future(result(t.ping.remote(), t)) for t in targets]
    await asyncio.wait(pings, timeout=PING_S)
    for ping in pings:
        ping.cancel()
    return [t for t, ping in zip(targets, pings, strict=True) if actor_died(ping)]
