"""The rollout group on a Ray cluster: engine replicas in rollout-worker actors.

Each :class:`RolloutWorker` composes the rollout process's parts in its own process
(:func:`toolrl.processes.in_process.build_rollouts`; its engine loads its own copy of the model) and runs
many groups at once. :class:`RolloutWorkerPool` runs groups and sends weights on the workers its
:class:`WorkerSlots` keep up, one per node while nodes last (a ``SPREAD`` placement group). A group never
straddles two workers; a worker that dies is replaced in its bundle and its groups run again elsewhere with
the same seeds (docs/recovery.md). Workers join the driver's Ray job and namespace, so named actors (the
global tool rate limiter) are one instance for all of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from toolrl import model_sources
from toolrl.config import Config, ConfigError
from toolrl.model_sources import model_path
from toolrl.processes.in_process import build_rollouts, seed_everything
from toolrl.processes.ray_actors import ActorDied, Placement, kill, result, retry
from toolrl.processes.resolve import RunPlan
from toolrl.ray_cluster import init_ray
from toolrl.schemas import Sample
from toolrl.training.weight_sync import send_engine_weights
from toolrl.trajectory import Trajectory
from toolrl.transports import Link, LinkedTransport, TransportError
from toolrl.transports.weight_rows import load_rows, receive_into, whole

if TYPE_CHECKING:
    from toolrl.processes import TrainerGroup

log = logging.getLogger(__name__)


class RolloutWorker:
    """One engine replica and the agent loop around it, in a Ray worker process (an async actor: the
    groups it is sent run at once, bounded by ``rollout.max_concurrent_trajectories``). The config travels
    as a plain mapping and samples come from the driver, so the worker never reads data files."""

    def __init__(self, config: Mapping[str, Any], plan: RunPlan | None = None) -> None:
        self.config = Config.model_validate(dict(config))  # samples are sent with each run
        self.plan = plan  # the run check's (toolrl.processes.resolve.RunPlan); None: decided at setup
        self._rollouts: Any = None  # toolrl.processes.in_process.Rollouts once set up
        self._links: list[Link] = []  # a linked weight transport's links, joined by _receivers
        self._receivers: list[Any] = []
        self._peer_sender: Any = None  # the sending end of a link to a new worker (open_peer_link)
        self._running = 0
        self._finished = 0

    async def setup(self, weights: Mapping[str, Any] | None = None, version: int | None = None) -> dict[str, Any]:
        """Compose on the actor's event loop (tools and engine bind to it); load ``weights`` if any."""
        t0 = time.perf_counter()
        seed_everything(self.config.trainer.seed)
        path = model_path(self.config)
        self._rollouts = await build_rollouts(self.config, path, model_sources.load_tokenizer(path), plan=self.plan)
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

    async def run(self, samples: Sequence[Mapping[str, Any]], groups: Sequence[int], n: int, seed: int,
                  id_prefix: str = "") -> list[dict[str, Any]]:
        """Groups at once (a batch's share, or one streamed group); ``groups[i]`` is sample i's group number:
        what ``run_rollouts`` gives those groups in a batch (same seeds, same ids)."""
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

    async def receive_weights(self, transport: LinkedTransport, links: Sequence[Link], index: int,
                              version: int | None = None) -> int:
        """One weight update over ``transport``: from every trainer rank's link at once, as receiver
        ``index``, loaded in place while the engine holds decoding; returns the bytes received. Raises
        TransportError within the links' timeout when a sender fails."""
        return await asyncio.to_thread(self._receive, transport, list(links), index, version)

    def _receive(self, transport: LinkedTransport, links: list[Link], index: int, version: int | None) -> int:
        engine = self._rollouts.engine
        if [link.key for link in links] != [link.key for link in self._links]:  # new links: join them
            self._close_receivers()
            self._receivers = engine.open_weight_receivers(transport, links, index)
            self._links = links
        try:
            return receive_into(engine, self._receivers, engine.weight_version if version is None else version)
        except TransportError:
            self._close_receivers()  # the controller makes new links
            raise

    async def open_peer_link(self, transport: LinkedTransport, key: str, timeout_s: float) -> Link | None:
        """The sending end of a link to one new worker, which gets this worker's weights over it
        (:meth:`send_peer_weights`) in place of the trainer's; what the new worker needs to join it.
        None: the engine cannot give its weights (``RolloutEngine.weight_tensors``)."""
        self._close_peer()
        if self._rollouts.engine.weight_tensors() is None:
            return None
        self._peer_sender = transport.open_sender(key, 0, 1, timeout_s)
        return self._peer_sender.link

    async def send_peer_weights(self, bucket_mb: float) -> int:
        """This engine's weights over the peer link, held still meanwhile (decoding, and a trainer sync,
        wait as for a weight load); returns their version. Raises TransportError when the receiver fails."""
        return await asyncio.to_thread(self._send_peer, bucket_mb)

    def _send_peer(self, bucket_mb: float) -> int:
        engine = self._rollouts.engine
        try:
            with engine.updating_weights(engine.weight_version):
                version = engine.weight_version
                send_engine_weights(engine, self._peer_sender, bucket_mb)
        finally:
            self._close_peer()
        return version

    def _close_peer(self) -> None:
        if self._peer_sender is not None:
            self._peer_sender.close()
            self._peer_sender = None

    def _close_receivers(self) -> None:
        for receiver in self._receivers:
            receiver.close()
        self._receivers, self._links = [], []

    def _load(self, state_dict: Mapping[str, Any], version: int | None) -> None:
        # Inside updating_weights the engine holds decoding for the whole load and takes the version
        # in the same pause (an engine whose weights cannot change, openai's, keeps its own).
        engine = self._rollouts.engine
        with engine.updating_weights(engine.weight_version if version is None else version):
            if state_dict:
                load_rows([engine], whole(state_dict))

    async def close(self) -> None:
        self._close_receivers()
        self._close_peer()
        if self._rollouts is not None:
            await self._rollouts.close()
            self._rollouts = None


@dataclass
class _Slot:
    """A place for one worker (bundle ``index`` of the pool's placement group); its actor is replaced
    when it dies."""

    index: int
    actor: Any
    setup_ref: Any  # ObjectRef of actor.setup(...)
    info: dict[str, Any] | None = None  # setup's result once it is up
    needs_weights: bool = False  # the trainer's current weights go to it once it is up
    inflight: int = 0  # groups sent to this slot's workers and not yet returned
    deaths: list[tuple[str, str, float]] = field(default_factory=list)  # (who, during, unix time), until up


class _IdleWorkers:
    """The workers free to take a share of one batch (:meth:`RolloutWorkerPool.run`): all of them, in slot
    order, at first; a slot whose worker died comes back once its replacement is up (that start is
    shared: it goes on if the batch ends first). ``exact`` (``one_step_off``: the trainer trains beside
    the batch, so a replacement gets newer weights than the batch's): a replacement waits while a worker
    the batch started on lives, which then runs the dead one's share."""

    def __init__(self, slots: int, start: Callable[[_Slot], asyncio.Task[dict[str, Any]]], exact: bool) -> None:
        self.slots, self.start, self.exact = slots, start, exact
        self.queue: asyncio.Queue[_Slot] = asyncio.Queue()
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()  # a replacement that cannot start
        self.died: set[int] = set()  # slots whose worker died during the batch
        self.held: list[_Slot] = []  # replacements up and kept out of it

    def _holding(self) -> bool:
        return self.exact and len(self.died) < self.slots

    def dead(self, slot: _Slot) -> None:
        """``slot``'s worker died (its replacement is starting)."""
        self.died.add(slot.index)
        if not self._holding():  # no worker the batch started on is left: the replacements take the shares
            while self.held:
                self.queue.put_nowait(self.held.pop())

        def up(start: asyncio.Task[dict[str, Any]]) -> None:
            if self.lost.done():
                return
            if start.cancelled():
                self.lost.cancel()
            elif (exc := start.exception()) is not None:
                self.lost.set_exception(exc)
            elif self._holding():
                self.held.append(slot)
            else:
                self.queue.put_nowait(slot)

        self.start(slot).add_done_callback(up)


class WorkerSlots:
    """The pool's workers, one per slot of a ``SPREAD`` placement group: each brought up (with the
    trainer's current weights, from a live peer that holds them or from the trainer), replaced in its slot
    when it dies (``max_attempts`` times in a row at most), and each replacement that comes up recorded for
    ``recoveries.jsonl``. ``address``: as ``ray.address`` (:func:`init_ray`); a Ray connection this process
    already has is used and left open."""

    def __init__(self, config: Config, num_workers: int, address: str | None, num_cpus_per_worker: float,
                 num_gpus_per_worker: float, setup_timeout_s: float, max_attempts: int, plan: RunPlan | None) -> None:
        import ray

        self.config = config
        self.setup_timeout_s = setup_timeout_s
        self.max_attempts = max_attempts
        self.restarts = 0  # workers replaced after dying
        self.recoveries: list[dict[str, Any]] = []  # replacements that came up, not yet taken by the controller
        self._payload = config.model_dump()
        self._plan = plan  # the run check's, for every worker (a replacement's too)
        self.weights: Any = None  # ObjectRef of the last broadcast state dict: a new worker loads it at setup
        self.weight_version = 0  # the version of the weights last sent to the workers
        # The trainer group, when training: a worker that comes up after a weight sync began (a
        # replacement) is sent its current weights, labelled weight_version, before it runs anything.
        self.weights_from: TrainerGroup | None = None
        self._starts: dict[int, asyncio.Task[dict[str, Any]]] = {}  # slot index -> its _ensure
        self._placement: Placement | None = None
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            if address is None:
                raise ConfigError("RolloutWorkerPool: give an address (local, auto or host:port) or call ray.init()")
            init_ray(address, num_workers * num_cpus_per_worker)
        try:
            self._placement = Placement.reserve(f"ray.num_rollout_workers={num_workers}", "worker", num_workers,
                                                num_cpus_per_worker, num_gpus_per_worker, "SPREAD")
            self._slots = [self._spawn(i) for i in range(num_workers)]
        except BaseException:
            self._shutdown()
            raise

    def __iter__(self) -> Iterator[_Slot]:
        return iter(self._slots)

    def __len__(self) -> int:
        return len(self._slots)

    def up(self) -> list[_Slot]:
        """The slots whose worker is up."""
        return [s for s in self._slots if s.info is not None]

    def _spawn(self, index: int) -> _Slot:
        import ray

        assert self._placement is not None
        actor: Any = ray.remote(RolloutWorker).options(**self._placement.options(index)).remote(self._payload, self._plan)
        return _Slot(index, actor, actor.setup.remote(self.weights, self.weight_version))

    def replace(self, slot: _Slot, dead: Any, during: str) -> None:
        """Start a new actor in ``slot`` unless that already happened for this dead actor (``during``:
        what it was found dead in, for the record)."""
        if slot.actor is not dead:
            return
        kill([dead])
        where = f" (pid {slot.info['pid']} on {slot.info['host']})" if slot.info else ""
        slot.deaths.append((f"rollout worker {slot.index}{where}", during, time.time()))
        new = self._spawn(slot.index)
        slot.actor, slot.setup_ref, slot.info = new.actor, new.setup_ref, None
        slot.needs_weights = self.weights_from is not None
        self.restarts += 1
        log.warning("rollout worker %d%s died: a new one takes its place%s", slot.index, where,
                    " with the trainer's current weights" if slot.needs_weights else "")

    async def _ensure(self, slot: _Slot) -> dict[str, Any]:
        """Wait until the slot's worker is set up (with the trainer's weights if it needs them),
        replacing it each time it dies on the way, ``max_attempts`` times at most."""

        async def attempt() -> dict[str, Any]:
            actor = slot.actor
            try:
                async with asyncio.timeout(self.setup_timeout_s):
                    info = await result(slot.setup_ref, actor)
            except TimeoutError:  # asyncio's, and Ray's GetTimeoutError
                raise TimeoutError(f"rollout worker {slot.index} was not up after {self.setup_timeout_s:g} s "
                                   "(not enough free resources on the cluster?)") from None
            pushed = slot.needs_weights and self.weights_from is not None
            peer = await self._weights_from_peer(slot, actor) if pushed else None
            if pushed and peer is None and (await self.weights_from.push([actor], self.weight_version)).dead:
                raise ActorDied(actor, f"rollout worker {slot.index} died while receiving weights")
            slot.info, slot.needs_weights = info, False
            self._record_recovery(slot, peer or (f"trainer weights (version {self.weight_version})" if pushed
                                  else "the latest broadcast" if self.weights is not None else "initial weights"))
            return info

        if slot.info is not None:
            return slot.info
        return await retry(attempt, self.max_attempts, lambda died: self.replace(slot, died.actor, "setup"))

    async def _weights_from_peer(self, slot: _Slot, actor: Any) -> str | None:
        """A new worker's weights from a live peer over the trainer's weight transport, when a peer
        holds the current version: where they came from (for the record), or None: the trainer sends
        them (no peer at that version, or the transfer failed)."""
        transport = getattr(self.weights_from, "transport", None)  # None: a trainer group without one (tests)
        if transport is None:
            return None
        timeout_s, bucket_mb = self.config.trainer.weight_push_timeout_s, self.config.trainer.weight_sync_bucket_mb
        for peer in [s for s in self.up() if s is not slot]:
            try:
                if (await result(peer.actor.ping.remote(), peer.actor))["weight_version"] != self.weight_version:
                    continue
                link = await result(peer.actor.open_peer_link.remote(transport, f"peer-{uuid.uuid4().hex[:12]}",
                                                                     timeout_s), peer.actor)
                if link is None:
                    return None  # the engine cannot give its weights: nor can any peer
                sent, got = await asyncio.gather(
                    result(peer.actor.send_peer_weights.remote(bucket_mb), peer.actor),
                    result(actor.receive_weights.remote(transport, [link], 0, self.weight_version), actor),
                    return_exceptions=True)
            except Exception:  # the peer died or failed: another peer, or the trainer
                continue
            if isinstance(got, ActorDied):
                raise got  # the new worker itself died
            if sent == self.weight_version and not isinstance(got, BaseException):
                return f"peer worker {peer.index} (version {sent}, {transport.name})"
            why = next((str(x).splitlines()[0] for x in (sent, got) if isinstance(x, BaseException)),
                       f"it held version {sent}")
            log.warning("rollout worker %d: weights from peer worker %d failed (%s); another live peer, "
                        "else the trainer, sends them", slot.index, peer.index, why)
        return None

    def _record_recovery(self, slot: _Slot, source: str) -> None:
        """A row for each death ``slot``'s worker, now up, replaced (none for a first start)."""
        assert slot.info is not None
        for who, during, seen in slot.deaths:
            took = time.time() - seen
            self.recoveries.append({"what": "rollout_worker", "died": who, "during": during, "mode": "replace",
                                    "source": source, "recovery_s": took, "steps_lost": 0, "time": seen,
                                    "index": slot.index, "worker": slot.info})
            log.warning("rollout worker %d is back (pid %s on %s) %.1f s after it died, with %s", slot.index,
                        slot.info["pid"], slot.info["host"], took, source)
        slot.deaths.clear()

    def start_task(self, slot: _Slot) -> asyncio.Task[dict[str, Any]]:
        """The one :meth:`_ensure` of ``slot`` on this event loop: a replacement comes up once, however
        many calls wait for it. A start that failed stays failed (it ends every call that needs it)."""
        loop = asyncio.get_running_loop()
        task = self._starts.get(slot.index)
        if (task is None or task.get_loop() is not loop or task.cancelled()
                or (task.done() and task.exception() is None and slot.info is None)):
            task = self._starts[slot.index] = loop.create_task(self._ensure(slot))
        return task

    async def least_loaded(self) -> _Slot:
        """The live worker with the fewest groups in flight (ties: the lowest index); starts the
        slots that are down and, when none is up, waits for the first to come up."""
        while True:
            starting = [self.start_task(s) for s in self._slots if s.info is None]
            for task in starting:
                if task.done():
                    task.result()  # a worker that cannot come up ends the call
            up = self.up()
            if up:
                return min(up, key=lambda s: (s.inflight, s.index))
            await asyncio.wait(starting, return_when=asyncio.FIRST_COMPLETED)

    async def start(self) -> list[dict[str, Any]]:
        """Wait for every worker to be up; returns each one's :meth:`RolloutWorker.setup` info."""
        return list(await asyncio.gather(*(self.start_task(s) for s in self._slots)))

    async def each(self, slots: Sequence[_Slot], call: Callable[[Any], Any]) -> None:
        """``call(actor)`` (a remote call) on every slot's worker at once; a dead one is replaced (its
        replacement's setup reads the latest broadcast and version)."""
        calls = [(s, s.actor) for s in slots]
        outcomes = await asyncio.gather(*(result(call(actor), actor) for _, actor in calls), return_exceptions=True)
        for (slot, actor), outcome in zip(calls, outcomes, strict=True):
            if isinstance(outcome, ActorDied):
                self.replace(slot, actor, "a weight update")
            elif isinstance(outcome, BaseException):
                raise outcome

    async def close(self) -> None:
        """Close the workers' engines and tools, end the actors, and shut Ray down if we started it."""
        import ray

        if not ray.is_initialized():
            return
        closing = [result(s.actor.close.remote(), s.actor) for s in self._slots]
        with contextlib.suppress(Exception):
            async with asyncio.timeout(30):
                await asyncio.gather(*closing, return_exceptions=True)
        kill([s.actor for s in self._slots])
        self.weights = None
        self._shutdown()

    def _shutdown(self) -> None:
        import ray

        if self._placement is not None:
            with contextlib.suppress(Exception):
                self._placement.remove()
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()


class RolloutWorkerPool:
    """``num_workers`` rollout workers driven from the controller's process: what runs on them (a batch's
    shares, streamed groups) and the weights sent to them; the workers themselves are its ``slots``."""

    def __init__(self, config: Config, num_workers: int = 1, address: str | None = "local", *,
                 num_cpus_per_worker: float = 1.0, num_gpus_per_worker: float = 0.0,
                 setup_timeout_s: float = 900.0, max_attempts: int = 3, plan: RunPlan | None = None) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be at least 1, got {num_workers}")
        # one_step_off: the trainer trains while a batch generates (see run).
        self.trains_beside_batches = config.trainer.async_schedule == "one_step_off"
        self.rerun_groups = 0  # groups run again because their worker died mid-step
        self.slots = WorkerSlots(config, num_workers, address, num_cpus_per_worker, num_gpus_per_worker,
                                 setup_timeout_s, max_attempts, plan)

    # ----------------------------------------------------------------- the rollout group

    @property
    def generating(self) -> RolloutWorkerPool:
        return self

    @property
    def workers(self) -> list[Any]:
        """The current actor handles, one per slot."""
        return [s.actor for s in self.slots]

    async def start(self) -> list[dict[str, Any]]:
        return await self.slots.start()

    async def ready(self) -> None:
        """Every worker up; a replacement starting now gets the trainer's weights before it counts."""
        await self.slots.start()

    async def check_trainable(self) -> str | None:
        """None when every worker's engine can be trained on, else the first reason given."""
        reasons = await asyncio.gather(*(result(w.check_trainable.remote(), w) for w in self.workers))
        return next((r for r in reasons if r is not None), None)

    def take_recoveries(self) -> list[dict[str, Any]]:
        """The replacements that came up since the last call, one row each for ``recoveries.jsonl``
        (``worker``: where the replacement runs)."""
        taken, self.slots.recoveries = self.slots.recoveries, []
        return taken

    @staticmethod
    async def _call(ref: Any, actor: Any) -> Any:
        """``ref``'s result; cancelled, the call is cancelled on the worker too."""
        import ray

        try:
            return await result(ref, actor)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                ray.cancel(ref)
            raise

    async def run_group(self, sample: Sample, group: int, n: int, seed: int, id_prefix: str = "") -> list[Trajectory]:
        """Group ``group`` on the live worker with the fewest groups in flight; if it dies, the group runs
        again (same seeds) on the next, ``max_attempts`` deaths in a row at most."""
        payload = sample.model_dump()
        slot: _Slot | None = None

        async def attempt() -> list[Trajectory]:
            nonlocal slot
            slot = await self.slots.least_loaded()
            slot.inflight += 1
            try:
                ref = slot.actor.run.remote([payload], [group], n, seed, id_prefix)
                return [Trajectory.model_validate(t) for t in await self._call(ref, slot.actor)]
            finally:
                slot.inflight -= 1

        def died(exc: ActorDied) -> None:
            assert slot is not None
            self.slots.replace(slot, exc.actor, f"group {group}")
            self.rerun_groups += 1

        return await retry(attempt, self.slots.max_attempts, died)

    async def run(self, samples: Sequence[Sample], n: int, seed: int, id_prefix: str = "") -> list[Trajectory]:
        """What ``run_rollouts`` returns, one contiguous share of the groups per worker. A dead worker's
        share goes whole to the first idle worker and runs there alone, so its trajectories are the same bit
        for bit (a group rerun beside others may round differently); under ``one_step_off`` see
        :class:`_IdleWorkers`."""
        payload = [s.model_dump() for s in samples]
        shares = [s for s in _split(len(samples), len(self.slots)) if s]
        results: dict[int, list[Trajectory]] = {}
        idle = _IdleWorkers(len(self.slots), self.slots.start_task, exact=self.trains_beside_batches)

        async def run_share(share: int) -> None:
            groups = shares[share]
            slot: _Slot | None = None

            async def attempt() -> None:
                nonlocal slot
                slot = await idle.queue.get()
                ref = slot.actor.run.remote([payload[g] for g in groups], groups, n, seed, id_prefix)
                results[share] = [Trajectory.model_validate(r) for r in await self._call(ref, slot.actor)]
                idle.queue.put_nowait(slot)

            def died(exc: ActorDied) -> None:
                assert slot is not None
                self.slots.replace(slot, exc.actor, f"a share of {len(groups)} groups")
                self.rerun_groups += len(groups)
                idle.dead(slot)

            await retry(attempt, self.slots.max_attempts, died)

        runs: list[asyncio.Future[None]] = []
        try:
            await self.slots.start()
            for slot in self.slots:
                idle.queue.put_nowait(slot)
            runs = [asyncio.ensure_future(run_share(i)) for i in range(len(shares))]
            while not all(r.done() for r in runs):
                await asyncio.wait([*runs, idle.lost], return_when=asyncio.FIRST_COMPLETED)
                for fut in (*runs, idle.lost):
                    if fut.done():
                        fut.result()  # a share out of attempts, or a replacement that cannot start, ends the step
        except Exception as exc:
            # What did finish goes on record with the failure (the controller writes its traces).
            exc.trajectories = [t for share in sorted(results) for t in results[share]]  # type: ignore[attr-defined]
            raise
        finally:
            for fut in runs:
                fut.cancel()  # a share in flight: cancelled on its worker too
            if not idle.lost.done():
                idle.lost.cancel()
        return [t for share in range(len(shares)) for t in results[share]]

    # ----------------------------------------------------------------- weights

    def weight_targets(self, version: int) -> list[Any]:
        """The workers that are up, for the trainer to send weights ``version`` to (also while they
        generate). ``version`` is recorded first: the workers not up yet get these weights, so
        labelled, once they are up and before they run anything."""
        self.slots.weight_version = version
        for slot in self.slots:
            slot.needs_weights = slot.needs_weights or slot.info is None
        return [s.actor for s in self.slots.up()]

    def replace(self, dead: Sequence[Any]) -> None:
        """Replace the workers ``dead`` (handles found dead by a weight push); each replacement gets the
        trainer's weights once up."""
        for slot in self.slots:
            if any(slot.actor is d for d in dead):
                self.slots.replace(slot, slot.actor, f"weight push {self.slots.weight_version}")

    async def set_weight_version(self, version: int) -> None:
        """Label the weights the workers hold as ``version`` (the weights themselves do not move)."""
        self.slots.weight_version = version
        # An update that loads nothing: the label alone.
        await self.slots.each(self.slots.up(), lambda actor: actor.update_weights.remote({}, version))

    async def broadcast(self, state_dict: Mapping[str, Any], version: int | None = None) -> None:
        """Send weights to every worker: one copy in the object store, read by each; ``version``
        labels them (None: the labels stay). Workers started later (replacements) load the latest
        broadcast during their setup."""
        import ray

        self.slots.weights = ray.put({k: v.detach().to("cpu") for k, v in state_dict.items()})
        if version is not None:
            self.slots.weight_version = version
        await self.slots.start()
        await self.slots.each(list(self.slots), lambda actor: actor.update_weights.remote(self.slots.weights, version))

    async def close(self) -> None:
        await self.slots.close()


def _split(count: int, parts: int) -> list[list[int]]:
    """``range(count)`` in ``parts`` contiguous, near-equal pieces (the first ones one longer)."""
    size, extra = divmod(count, parts)
    starts = [i * size + min(i, extra) for i in range(parts + 1)]
    return [list(range(a, b)) for a, b in zip(starts, starts[1:], strict=False)]
