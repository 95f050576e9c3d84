"""The rollout group on a Ray cluster: engine replicas in rollout-worker actors.

Each :class:`RolloutWorker` is a Ray actor that composes, in its own process, the rollout role only
(:func:`toolrl.roles.compose.compose_rollouts`: tokenizer, engine, parser, tools, rewards; the engine loads
its own copy of the model, never the training model) and runs the async agent loop on the groups it
is sent, many at once (an async actor). :class:`RolloutWorkerPool` places one worker per node where
the cluster has several (node affinity). A step's batch (:meth:`~RolloutWorkerPool.run`) is split
into one share of GRPO groups per worker; streamed groups (:meth:`~RolloutWorkerPool.run_group`) go
one by one to the live worker with the fewest groups in flight. A group never straddles two workers.
A worker that dies is replaced in the background and its groups run again on a live worker with the
same seeds.

New weights reach the workers whole (:meth:`~RolloutWorkerPool.broadcast`, through the object store)
or in buckets from the trainer ranks (:mod:`toolrl.training.weight_sync`), also while they generate: a worker
stages the buckets and loads them into its engine together on the last one, so a decode step runs on
the old weights or the new ones, never a mix, and the engine's ``weight_version`` becomes the version
the last bucket carried.

Workers join the driver's Ray job and namespace, so named actors such as the global tool rate
limiter (:class:`toolrl.tools.ratelimit.RayRateLimiter`) are one instance for all of them.
``ray`` is imported only when a pool is built.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import socket
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from toolrl.config import Config, ConfigError
from toolrl.rollout import Trajectory
from toolrl.schemas import Sample


class RolloutWorker:
    """One engine replica and the agent loop around it, in a Ray worker process.

    Built with ``ray.remote(RolloutWorker)`` by the pool; the config travels as a plain mapping and is
    validated again here. Samples come from the driver, so the worker never reads data files. An
    async actor: the groups it is sent run concurrently on its event loop (Ray allows 1000 calls in
    flight by default), bounded by ``rollout.max_concurrent_trajectories``, and weight buckets
    arrive between them.
    """

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config = Config.model_validate(dict(config))  # samples are sent with each run
        self._rollouts: Any = None  # toolrl.roles.compose.Rollouts once set up
        self._staged: dict[str, Any] = {}  # buckets of a weight update in flight
        self._running = 0
        self._finished = 0

    async def setup(self, weights: Mapping[str, Any] | None = None, version: int | None = None) -> dict[str, Any]:
        """Compose on the actor's event loop (tools and engine bind to it); load ``weights`` if any."""
        from toolrl import models
        from toolrl.roles.compose import compose_rollouts, model_path, seed_everything

        t0 = time.perf_counter()
        seed_everything(self.config.trainer.seed)
        path = model_path(self.config)
        self._rollouts = await compose_rollouts(self.config, path, models.load_tokenizer(path))
        if weights is not None:
            self._load(weights, version)
        return {**self.ping(), "setup_s": time.perf_counter() - t0}

    async def check_trainable(self) -> str | None:
        return await self._rollouts.engine.check_trainable()

    def ping(self) -> dict[str, Any]:
        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid(),
                "host": socket.gethostname(), "running": self._running, "finished": self._finished,
                "weight_version": getattr(self._rollouts.engine, "weight_version", 0) if self._rollouts else 0}

    async def run_group(self, sample: Mapping[str, Any], group: int, n: int, seed: int,
                        id_prefix: str = "") -> list[dict[str, Any]]:
        """The ``n`` trajectories of group ``group``: what ``run_rollouts`` gives that group in a batch
        (same seeds, same ids)."""
        return [t.model_dump() for t in await self._group(Sample.model_validate(sample), group, n, seed, id_prefix)]

    async def run(self, samples: Sequence[Mapping[str, Any]], groups: Sequence[int], n: int, seed: int,
                  id_prefix: str = "") -> list[dict[str, Any]]:
        """Several groups at once (a batch's share); ``groups[i]`` is sample i's group number."""
        parsed = [Sample.model_validate(s) for s in samples]
        out = await asyncio.gather(*(self._group(s, g, n, seed, id_prefix) for s, g in zip(parsed, groups, strict=True)))
        return [t.model_dump() for trajs in out for t in trajs]

    async def _group(self, sample: Sample, group: int, n: int, seed: int, id_prefix: str) -> list[Trajectory]:
        # compose.Rollouts.run_group: seeds and ids as run_rollouts gives them, and one bound
        # (rollout.max_concurrent_trajectories) over every group in flight on this worker.
        if self._rollouts is None:
            raise RuntimeError("RolloutWorker: a run before setup")
        self._running += 1
        try:
            trajs = await self._rollouts.run_group(sample, group, n, seed, id_prefix)
        finally:
            self._running -= 1
        self._finished += len(trajs)
        return trajs

    async def update_weights(self, state_dict: Mapping[str, Any], version: int | None = None) -> None:
        # In a thread: the engine waits for its running step, and the loop keeps serving the groups.
        await asyncio.to_thread(self._load, state_dict, version)

    async def update_weights_bucket(self, bucket: Mapping[str, Any], last: bool, version: int | None = None) -> None:
        """Stage ``bucket``; on the last one load every staged tensor at once. Loading each bucket as
        it comes would let the decode steps in between run on half-updated weights; staging costs
        one copy of the weights while a push is in flight."""
        self._staged.update(bucket)
        if last:
            staged, self._staged = self._staged, {}
            await self.update_weights(staged, version)

    async def set_weight_version(self, version: int) -> None:
        """Label the engine's weights ``version`` (an update that loads nothing)."""
        await asyncio.to_thread(self._load, {}, version)

    def _load(self, state_dict: Mapping[str, Any], version: int | None) -> None:
        # Inside updating_weights the engine holds decoding for the whole load and takes the version
        # in the same pause (an engine whose weights cannot change, openai's, keeps its own).
        engine = self._rollouts.engine
        with engine.updating_weights(engine.weight_version if version is None else version):
            if state_dict:
                engine.update_weights(state_dict)

    async def close(self) -> None:
        if self._rollouts is None:
            return
        await self._rollouts.close()
        self._rollouts = None


@dataclass
class _Slot:
    """A place for one worker; its actor is replaced when it dies."""

    index: int
    node_id: str | None  # where it was placed (None: anywhere)
    actor: Any
    setup_ref: Any  # ObjectRef of actor.setup(...)
    info: dict[str, Any] | None = None  # setup's result once it is up
    failures: int = 0  # consecutive deaths before being up
    needs_weights: bool = False  # a replacement: the trainer's current weights go to it once it is up
    inflight: int = 0  # groups sent to this slot's workers and not yet returned


class RolloutWorkerPool:
    """``num_workers`` rollout workers on a Ray cluster, driven from this (the trainer's) process.

    ``address``: ``"local"`` starts a private Ray instance on this machine (shut down by :meth:`close`),
    ``"auto"`` joins the cluster running on this machine, ``"host:port"`` joins that cluster. If Ray is
    already initialised in this process, that connection is used and left open.
    """

    def __init__(self, config: Config, num_workers: int = 1, address: str | None = "local", *,
                 num_cpus_per_worker: float = 1.0, num_gpus_per_worker: float = 0.0,
                 setup_timeout_s: float = 900.0, max_attempts: int = 3) -> None:
        import ray

        if num_workers < 1:
            raise ValueError(f"num_workers must be at least 1, got {num_workers}")
        self.config = config
        self.num_cpus_per_worker = num_cpus_per_worker
        self.num_gpus_per_worker = num_gpus_per_worker
        self.setup_timeout_s = setup_timeout_s
        self.max_attempts = max_attempts
        self.restarts = 0  # workers replaced after dying
        self.rerun_groups = 0  # groups run again because their worker died mid-step
        self._payload = config.model_dump()
        self._weights: Any = None  # ObjectRef of the last broadcast state dict
        self.weight_version = 0  # the version of the weights last sent to the workers
        # Set by a trainer group that sends weights in buckets (RayTrainerGroup.push): called with
        # worker handles and ``version=``; by push_weights, and for a replacement worker once it is
        # up, before it runs anything.
        self.weight_source: Callable[..., Awaitable[dict[str, Any]]] | None = None
        self._starts: dict[int, asyncio.Task[dict[str, Any]]] = {}  # slot index -> its _ensure
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            if address is None:
                raise ConfigError("RolloutWorkerPool: give an address (local, auto or host:port) or call ray.init()")
            init_ray(address, num_workers * num_cpus_per_worker)
        try:
            self._slots = [self._spawn(i, node) for i, node in enumerate(self._place(num_workers))]
        except BaseException:
            self._shutdown()
            raise

    # ----------------------------------------------------------------- placement

    def _place(self, num_workers: int) -> list[str | None]:
        """A node per worker: round-robin over alive nodes (this node first) within each one's
        capacity, so several nodes get one worker each before any gets a second."""
        import ray

        here = ray.get_runtime_context().get_node_id()
        capacity: dict[str, float] = {}
        for node in ray.nodes():
            if not node["Alive"]:
                continue
            res = node["Resources"]
            fits = [res.get(k, 0.0) // need for k, need in (("CPU", self.num_cpus_per_worker),
                                                               ("GPU", self.num_gpus_per_worker)) if need > 0]
            capacity[node["NodeID"]] = min(fits) if fits else math.inf
        order = sorted((n for n in capacity if capacity[n] > 0), key=lambda n: (n != here, n))
        if sum(capacity[n] for n in order) < num_workers:
            total = ray.cluster_resources()
            raise ConfigError(
                f"ray.num_rollout_workers={num_workers} needs {num_workers * self.num_cpus_per_worker:g} CPUs and "
                f"{num_workers * self.num_gpus_per_worker:g} GPUs on nodes that fit a worker; the cluster has "
                f"{total.get('CPU', 0):g} CPUs and {total.get('GPU', 0):g} GPUs")
        placed: list[str | None] = []
        while len(placed) < num_workers:
            for node in order:
                if len(placed) < num_workers and capacity[node] >= 1:
                    capacity[node] -= 1
                    placed.append(node)
        return placed

    def _spawn(self, index: int, node_id: str | None) -> _Slot:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        options: dict[str, Any] = {"num_cpus": self.num_cpus_per_worker, "num_gpus": self.num_gpus_per_worker,
                                   "max_restarts": 0}
        if node_id in alive:
            # Soft: if the node goes away, a replacement may start elsewhere instead of waiting.
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id, soft=True)
        actor = ray.remote(RolloutWorker).options(**options).remote(self._payload)
        return _Slot(index, node_id, actor, actor.setup.remote(self._weights, self.weight_version))

    def _replace(self, slot: _Slot, dead: Any) -> None:
        """Start a new actor in ``slot`` unless that already happened for this dead actor."""
        import ray

        if slot.actor is not dead:
            return
        with contextlib.suppress(Exception):
            ray.kill(dead, no_restart=True)
        new = self._spawn(slot.index, slot.node_id)
        slot.actor, slot.setup_ref, slot.info = new.actor, new.setup_ref, None
        slot.needs_weights = self.weight_source is not None
        self.restarts += 1

    async def _ensure(self, slot: _Slot) -> dict[str, Any]:
        """Wait until the slot's worker is set up, replacing it if it dies on the way."""
        from ray.exceptions import RayActorError

        while slot.info is None:
            actor = slot.actor
            try:
                info = await asyncio.wait_for(_result(slot.setup_ref), self.setup_timeout_s)
                if slot.needs_weights and self.weight_source is not None:
                    await self.weight_source([actor], version=self.weight_version)
                slot.info, slot.needs_weights, slot.failures = info, False, 0
            except RayActorError:
                slot.failures += 1
                if slot.failures >= self.max_attempts:
                    raise
                self._replace(slot, actor)
            except TimeoutError:  # asyncio's, and Ray's GetTimeoutError
                raise TimeoutError(f"rollout worker {slot.index} was not up after {self.setup_timeout_s:g} s "
                                   "(not enough free resources on the cluster?)") from None
        return slot.info

    def _start_task(self, slot: _Slot) -> asyncio.Task[dict[str, Any]]:
        """The one :meth:`_ensure` of ``slot`` on this event loop: a replacement comes up once, however
        many calls wait for it. A start that failed stays failed (it ends every call that needs it)."""
        loop = asyncio.get_running_loop()
        task = self._starts.get(slot.index)
        if (task is None or task.get_loop() is not loop or task.cancelled()
                or (task.done() and task.exception() is None and slot.info is None)):
            task = self._starts[slot.index] = loop.create_task(self._ensure(slot))
        return task

    async def _least_loaded(self) -> _Slot:
        """The live worker with the fewest groups in flight (ties: the lowest index); starts the
        slots that are down and, when none is up, waits for the first to come up."""
        while True:
            starting = [self._start_task(s) for s in self._slots if s.info is None]
            for task in starting:
                if task.done():
                    task.result()  # a worker that cannot come up ends the call
            up = [s for s in self._slots if s.info is not None]
            if up:
                return min(up, key=lambda s: (s.inflight, s.index))
            await asyncio.wait(starting, return_when=asyncio.FIRST_COMPLETED)

    # ----------------------------------------------------------------- public API

    @property
    def workers(self) -> list[Any]:
        """The current actor handles, one per slot."""
        return [s.actor for s in self._slots]

    async def start(self) -> list[dict[str, Any]]:
        """Wait for every worker to be up; returns each one's node id, pid and setup time."""
        return list(await asyncio.gather(*(self._start_task(s) for s in self._slots)))

    async def check_trainable(self) -> str | None:
        """None when every worker's engine can be trained on, else the first reason given."""
        reasons = await asyncio.gather(*(_result(w.check_trainable.remote()) for w in self.workers))
        return next((r for r in reasons if r is not None), None)

    async def run_group(self, sample: Sample, group: int, n: int, seed: int, id_prefix: str = "") -> list[Trajectory]:
        """The ``n`` trajectories of group ``group`` (what ``run_rollouts`` gives that group in a batch
        with ``seed`` and ``id_prefix``), from the live worker with the fewest groups in flight.

        If that worker dies before the group is done, it is replaced in the background and the group
        runs again on the next least-loaded live worker (or the first to come up), with the same
        seeds; ``max_attempts`` deaths in a row end the call.
        """
        import ray
        from ray.exceptions import RayActorError

        payload = sample.model_dump()
        for attempt in range(1, self.max_attempts + 1):
            slot = await self._least_loaded()
            actor = slot.actor
            ref = actor.run_group.remote(payload, group, n, seed, id_prefix)
            slot.inflight += 1
            try:
                return [Trajectory.model_validate(t) for t in await _result(ref)]
            except RayActorError:
                if attempt == self.max_attempts:
                    raise
                self._replace(slot, actor)
                self.rerun_groups += 1
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):
                    ray.cancel(ref)
                raise
            finally:
                slot.inflight -= 1
        raise AssertionError("unreachable")

    async def run(self, samples: Sequence[Sample], n: int, seed: int, id_prefix: str = "") -> list[Trajectory]:
        """What ``run_rollouts(ctx, samples, n, seed, id_prefix)`` returns, computed by the workers.

        Each worker gets one contiguous share of the groups, started together. The share of a worker
        that dies goes, whole, to the first worker to be idle, a live one or the dead one's
        replacement, and runs there alone as it would have on its own worker: same seeds, same
        batch, so the same trajectories bit for bit (:meth:`run_group` reruns a group on a worker
        that may be decoding others, which changes float rounding and so, rarely, a sampled token).
        """
        import ray
        from ray.exceptions import RayActorError

        payload = [s.model_dump() for s in samples]
        shares = [s for s in _split(len(samples), len(self._slots)) if s]
        results: dict[int, list[Trajectory]] = {}
        attempts = dict.fromkeys(range(len(shares)), 0)
        pending: list[int] = []  # shares waiting for an idle worker
        idle: list[_Slot] = []
        runs: dict[asyncio.Future[Any], tuple[int, _Slot, Any, Any]] = {}  # share, slot, actor, ref
        starting: dict[asyncio.Future[Any], _Slot] = {}  # replacements being set up

        def submit(share: int, slot: _Slot) -> None:
            groups = shares[share]
            ref = slot.actor.run.remote([payload[g] for g in groups], groups, n, seed, id_prefix)
            runs[asyncio.ensure_future(_result(ref))] = (share, slot, slot.actor, ref)

        try:
            await self.start()
            idle = list(self._slots[len(shares):])
            for share, slot in enumerate(self._slots[: len(shares)]):
                submit(share, slot)
            while len(results) < len(shares):
                done, _ = await asyncio.wait([*runs, *starting], return_when=asyncio.FIRST_COMPLETED)
                for fut in done:
                    if fut in starting:
                        slot = starting.pop(fut)
                        fut.result()  # a replacement that cannot start ends the step
                        idle.append(slot)
                        continue
                    share, slot, actor, _ = runs.pop(fut)
                    try:
                        results[share] = [Trajectory.model_validate(r) for r in fut.result()]
                        idle.append(slot)
                    except RayActorError:
                        attempts[share] += 1
                        if attempts[share] >= self.max_attempts:
                            raise
                        self._replace(slot, actor)
                        starting[self._start_task(slot)] = slot
                        pending.append(share)
                        self.rerun_groups += len(shares[share])
                while pending and idle:
                    submit(pending.pop(0), idle.pop(0))
        except Exception as exc:
            # What did finish goes on record with the failure (the controller writes its traces).
            exc.trajectories = [t for share in sorted(results) for t in results[share]]  # type: ignore[attr-defined]
            raise
        finally:
            # A replacement keeps starting (its task is shared); the next start() waits for it.
            for fut, (_, _, _, ref) in runs.items():
                fut.cancel()
                with contextlib.suppress(Exception):
                    ray.cancel(ref)
        return [t for share in range(len(shares)) for t in results[share]]

    async def push_weights(self, version: int) -> dict[str, Any]:
        """The trainer's current weights to every worker, in buckets through ``weight_source``, also
        while they generate; each worker's engine takes ``version`` with the last bucket. Workers
        found dead are replaced (their replacements get the weights once up). Returns the sync's
        metrics (``weight_sync_s``, ``weight_sync_peak_mb``)."""
        if self.weight_source is None:
            raise RuntimeError("RolloutWorkerPool.push_weights needs a weight_source (a trainer group)")
        self.weight_version = version  # before the push: a worker that comes up meanwhile asks for it
        up = [s for s in self._slots if s.info is not None]
        for slot in self._slots:
            slot.needs_weights = slot.needs_weights or slot.info is None  # they get the weights once up
        out = dict(await self.weight_source([s.actor for s in up], version=version))
        for i in out.pop("dead", []):
            self._replace(up[i], up[i].actor)
        return out

    async def set_weight_version(self, version: int) -> None:
        """Label the weights the workers hold as ``version`` (the weights themselves do not move)."""
        from ray.exceptions import RayActorError

        self.weight_version = version
        calls = [(s, s.actor, s.actor.set_weight_version.remote(version)) for s in self._slots if s.info is not None]
        outcomes = await asyncio.gather(*(_result(ref) for _, _, ref in calls), return_exceptions=True)
        for (slot, actor, _), outcome in zip(calls, outcomes):
            if isinstance(outcome, RayActorError):
                self._replace(slot, actor)  # its replacement's setup takes the version
            elif isinstance(outcome, BaseException):
                raise outcome

    async def broadcast(self, state_dict: Mapping[str, Any], version: int | None = None) -> None:
        """Send weights to every worker: one copy in the object store, read by each; ``version``
        labels them (None: the labels stay). Workers started later (replacements) load the latest
        broadcast during their setup."""
        import ray
        from ray.exceptions import RayActorError

        self._weights = ray.put({k: v.detach().to("cpu") for k, v in state_dict.items()})
        if version is not None:
            self.weight_version = version
        await self.start()
        slots = list(self._slots)
        calls = [(s, s.actor, s.actor.update_weights.remote(self._weights, version)) for s in slots]
        outcomes = await asyncio.gather(*(_result(ref) for _, _, ref in calls), return_exceptions=True)
        for (slot, actor, _), outcome in zip(calls, outcomes):
            if isinstance(outcome, RayActorError):
                self._replace(slot, actor)  # its replacement's setup reads the weights just put
            elif isinstance(outcome, BaseException):
                raise outcome

    def replace(self, indexes: Sequence[int]) -> None:
        """Replace the workers at ``indexes`` (found dead by a caller); they come up on the next start."""
        for i in indexes:
            slot = self._slots[i]
            self._replace(slot, slot.actor)

    def close(self) -> None:
        """Close the workers' engines and tools, end the actors, and shut Ray down if we started it."""
        import ray

        if not ray.is_initialized():
            return
        refs = [s.actor.close.remote() for s in self._slots]
        with contextlib.suppress(Exception):
            ray.wait(refs, num_returns=len(refs), timeout=30)
        for slot in self._slots:
            with contextlib.suppress(Exception):
                ray.kill(slot.actor, no_restart=True)
        self._weights = None
        self._shutdown()

    def _shutdown(self) -> None:
        import ray

        if self._owns_ray and ray.is_initialized():
            ray.shutdown()


def init_ray(address: str, cpus_needed: float) -> None:
    """Connect this process to Ray: ``"local"`` starts a private instance on this machine with at least
    ``cpus_needed`` logical CPUs (so a laptop can run more actors than it has cores)."""
    import ray

    options: dict[str, Any] = {"include_dashboard": False}
    if address == "local":
        options["num_cpus"] = max(os.cpu_count() or 1, math.ceil(cpus_needed))
    ray.init(address=address, **options)


async def _result(ref: Any) -> Any:
    return await ref


def _split(count: int, parts: int) -> list[list[int]]:
    """``range(count)`` in ``parts`` contiguous, near-equal pieces (the first ones one longer)."""
    size, extra = divmod(count, parts)
    out, start = [], 0
    for i in range(parts):
        end = start + size + (i < extra)
        out.append(list(range(start, end)))
        start = end
    return out
