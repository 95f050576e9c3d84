"""A trainer group that re-forms itself when a rank dies (``trainer.on_rank_failure``), in :func:`recovering`,
the loop it shares with the public step's :class:`~toolrl.processes.step_group.StepGroup`.

A rank's death ends the group's call in flight at once with :class:`RankDied`; unless the mode is
``stop``, every rank is killed (survivors may wait in a collective with the dead one forever), a new
group starts from the newest complete state, and the interrupted call runs again. Step N's copies are
made off the step's critical path; until all are complete N-1's stay the recovery source, so a death
costs a step trained again, never a step lost. Each recovery is one log line and one :class:`Recovery`
record. The steps, their guarantees and their costs: docs/recovery.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from toolrl.config import Config, ConfigError, RayConfig
from toolrl.processes.ray_actors import ActorDied, Placement, kill, result

log = logging.getLogger(__name__)
T = TypeVar("T")

MAX_DEATHS_PER_CALL = 3
# How long a re-forming group waits for Ray's verdict on the node of a rank it could not reach (Ray
# declares a silent node dead after missed health checks: 10-20 s with its defaults).
NODE_VERDICT_S = 60.0


class TrainerFailed(RuntimeError):
    """A trainer rank died or raised; the message is one line naming the rank and the step."""


class RankDied(TrainerFailed):
    """Trainer rank ``rank``'s actor died (its process or its node) during ``during`` (a call, "step 3"):
    the group can be re-formed. ``who`` names it for the recovery's lines and record ("trainer rank 1 (pid
    123 on host)")."""

    def __init__(self, who: str, during: str, rank: int, unavailable: bool = False) -> None:
        super().__init__(f"{who} died during {during}")
        self.who, self.during, self.rank = who, during, rank
        self.unavailable = unavailable  # not reachable, not yet declared dead: its node may be lost


@dataclass
class Recovery:
    """One re-formed trainer group, as ``recoveries.jsonl`` records it."""

    died: str  # "trainer rank 1 (pid 123 on host)"
    during: str  # "step 3", "weight sync", "checkpoint of step 4"
    mode: str  # replace | shrink
    world_size_before: int
    world_size: int
    source: str  # "memory (step 2)", "checkpoint <dir>", "initial weights"
    recovery_s: float
    steps_lost: int = 0
    time: float = 0.0  # unix time the death was seen
    what: str = "trainer_rank"
    ranks: list[dict[str, Any]] = field(default_factory=list)  # the new group: where each rank runs
    node: str | None = None  # the Ray node id the dead rank ran on (a lost node: every rank it held)


class ReformingGroup:
    """What :class:`toolrl.processes.trainer_group.RayTrainerGroup` does when a rank dies. The group keeps
    ``config``, ``world_size``, ``placement``, ``ranks`` and starts and calls its ranks (``_spawn``,
    ``start``, ``_all``); this part keeps where a new group's state comes from."""

    config: Config
    world_size: int
    placement: Placement
    ranks: list[Any]
    infos: list[dict[str, Any]]
    start: Callable[..., Awaitable[list[dict[str, Any]]]]
    _spawn: Callable[[int], list[Any]]
    _all: Callable[..., Awaitable[list[Any]]]

    def _init_recovery(self) -> None:
        self.copies: list[Any] | None = None  # object refs of every rank's copy after the last step
        self.copies_step: int | None = None
        self.loaded: str | None = None  # the checkpoint the run resumed from, before any step
        self.recoveries: list[Recovery] = []  # not yet taken by the controller
        # The step whose copies are not all complete yet, and its batch (an object ref): trained
        # again on a group re-formed from the copies before it.
        self.pending: tuple[int, Any] | None = None
        self._copying: asyncio.Task[None] | None = None  # the copies of ``pending`` being made
        self.copy_s = 0.0  # how long the last complete copies took to make, store and pull
        self.copy_wait_s = 0.0  # how long calls waited for copies in flight, since the last step's figures
        # Calls may overlap (a replaced rollout worker's weights while the controller steps): the
        # first to see a death re-forms the group; the others wait for it and run again on it.
        self._reforming = asyncio.Lock()
        self._generation = 0

    # -- recovery -------------------------------------------------------------------------------

    def take_recoveries(self) -> list[dict[str, Any]]:
        """The recoveries since the last call, as rows (for the controller's records)."""
        taken, self.recoveries = self.recoveries, []
        return [asdict(r) for r in taken]

    async def _recovering(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """``call()`` (:func:`recovering`), the group re-formed right after each rank death (``stop``: none)."""
        generation = self._generation  # the group the attempt runs on

        async def reform(died: RankDied) -> None:
            nonlocal generation
            async with self._reforming:
                if generation == self._generation:  # not re-formed meanwhile by another call
                    await self._reform(died, what)
                    self._generation += 1
                generation = self._generation  # nothing runs between here and the next attempt

        return await recovering(call, reform=reform, stop=self.config.trainer.on_rank_failure == "stop")

    async def _reform(self, died: RankDied, what: str) -> None:
        seen = time.time()
        t0 = time.perf_counter()
        who = died.who
        mode = self.config.trainer.on_rank_failure
        log.warning("%s died during %s: re-forming the trainer group (%s)", who, what, mode)
        before = self.world_size
        node = self.infos[died.rank].get("node_id") if died.rank < len(self.infos) else None
        timeout = self.config.trainer.recovery_timeout_s
        try:
            async with asyncio.timeout(timeout):
                source = await self._new_group(mode, node if died.unavailable else None)
        except TimeoutError:
            raise TrainerFailed(f"{who} died during {what}; the trainer group was not re-formed within "
                                f"trainer.recovery_timeout_s={timeout:g} s") from None
        record = Recovery(who, what, mode if self.world_size == before else "shrink", before, self.world_size,
                          source, time.perf_counter() - t0, time=seen,
                          ranks=[{k: i.get(k) for k in ("rank", "pid", "host", "node_id")} for i in self.infos],
                          node=node)
        self.recoveries.append(record)
        log.warning("trainer group re-formed after %s died: %d rank(s) from %s in %.1f s", who, self.world_size,
                    source, record.recovery_s)

    async def _new_group(self, mode: str, unreachable: str | None = None) -> str:
        """Kill every rank, start the new group and load the newest state into it; where it came from.
        ``unreachable``: the node of a rank Ray could not reach, waited for first (see
        :meth:`_node_verdict`)."""
        t0 = time.perf_counter()
        self._discard_copies()
        end_ranks(self.ranks, self.placement)
        if unreachable is not None:
            await self._node_verdict(unreachable)
        size = self.world_size if mode == "replace" else max(1, self.world_size - 1)
        try:
            self.placement = reserve_ranks(self.config.ray, size, reforming=True)
        except ConfigError:
            if size == 1:
                raise
            log.warning("no room for %d trainer ranks: continuing with %d", size, size - 1)
            size -= 1
            self.placement = reserve_ranks(self.config.ray, size, reforming=True)
        self.world_size = size
        self.ranks = self._spawn(size)
        t1 = time.perf_counter()
        await self.start(self.config.trainer.recovery_timeout_s)
        log.info("trainer group of %d: placed in %.1f s, started in %.1f s", size, t1 - t0, time.perf_counter() - t1)
        if self.copies is not None:
            await self._all([r.restore.remote(self.copies) for r in self.ranks], "recovery")
            source = f"memory (step {self.copies_step})"
        elif self.loaded is not None:
            await self._all([r.load.remote(self.loaded) for r in self.ranks], "recovery")
            source = f"checkpoint {self.loaded}"
        else:
            source = "initial weights"
        if self.pending is not None:  # its copies were not complete: trained again from the state before it
            step, batch = self.pending
            await self._train(batch, step)
            await self._keep_copies(step)
            source += f", step {step} run again"
        return source

    @staticmethod
    async def _node_verdict(node: str) -> None:
        """Wait until Ray declares ``node`` dead (at most :data:`NODE_VERDICT_S`; a node still alive
        then is taken as alive): a rank that could not be reached may have gone with its node, which
        Ray counts as alive until it misses its health checks, and a group placed before that could be
        placed on the lost node."""
        import ray

        deadline = time.monotonic() + NODE_VERDICT_S
        log.warning("node %s does not answer: waiting for Ray to declare it lost (at most %g s)", node, NODE_VERDICT_S)
        while time.monotonic() < deadline:
            alive = await asyncio.to_thread(lambda: [n["Alive"] for n in ray.nodes() if n["NodeID"] == node])
            if not alive or not alive[0]:
                log.warning("node %s is lost", node)
                return
            await asyncio.sleep(0.5)

    async def _train(self, batch: Any, step: int) -> list[dict[str, Any]]:
        """Every rank's step on ``batch`` (an object ref of the step's trajectories); their results."""
        return await self._all([r.step.remote(batch) for r in self.ranks], f"step {step}")

    def _start_copies(self, step: int, batch: Any) -> None:
        """Start every rank's copy of its state after ``step`` without waiting for it (none with
        ``on_rank_failure: stop``: nothing would recover from it); ``batch`` is kept until the copies
        are complete, to train the step again should a rank die before."""
        if self.config.trainer.on_rank_failure == "stop":
            return
        self.pending = (step, batch)
        self._copying = asyncio.ensure_future(self._keep_copies(step))
        # A failure is raised to the call that waits for the copies; one discarded is not reported.
        self._copying.add_done_callback(lambda task: task.cancelled() or task.exception())

    async def _copied(self) -> None:
        """Wait for the copies in flight (before the state changes or is written): a rank that died
        meanwhile raises :class:`RankDied` here."""
        if self._copying is None:
            return
        t0 = time.perf_counter()
        try:
            await self._copying
        finally:
            self._copying = None
            self.copy_wait_s += time.perf_counter() - t0

    def _discard_copies(self) -> None:
        """Stop waiting for the copies in flight (a load, a close, a re-form: they are not needed)."""
        if self._copying is not None:
            self._copying.cancel()
            self._copying = None

    async def _keep_copies(self, step: int) -> None:
        """Every rank's in-memory copy of its state after ``step`` (a 1-based step number), kept in
        the object store (owned by this process, so a rank's death does not take it) and, when the
        ranks span nodes, pulled by a rank on another node (:func:`peer_holders`), so a lost node
        does not take it either. Only when all of them are there do they replace the previous
        step's (``copy_s``: how long that took). On each rank's ``copy`` concurrency group: other
        calls (a weight push) run meanwhile."""
        t0 = time.perf_counter()
        what = f"the copy of step {step}"
        calls = [r.snapshot.options(num_returns=2, concurrency_group="copy").remote() for r in self.ranks]
        await self._all([c[0] for c in calls], what)
        copies = [c[1] for c in calls]
        holders = peer_holders([info.get("node_id") for info in self.infos])
        if holders:  # the refs go inside a list: the holder pulls them itself and keeps what it got
            await self._all([r.hold_copies.options(concurrency_group="copy").remote(
                step, [copies[j] for j in holders.get(i, [])]) for i, r in enumerate(self.ranks)], what)
        self.copies = copies  # the previous step's copies are freed
        self.copies_step, self.loaded = step, None
        self.pending = None
        for i in holders:  # kept until now: a node lost while the new ones were pulled had the old ones
            self.ranks[i].release_copies.options(concurrency_group="copy").remote(step)
        self.copy_s = time.perf_counter() - t0


async def recovering(call: Callable[[], Awaitable[T]], *, ready: Callable[[], Awaitable[None]] | None = None,
                     reform: Callable[[RankDied], Awaitable[None]] | None = None,
                     failed: Callable[[TrainerFailed], None] = lambda failure: None, stop: bool = False) -> T:
    """``call()``, made again after each rank death (:class:`RankDied`; at most :data:`MAX_DEATHS_PER_CALL`
    a call, none with ``stop``); any other :class:`TrainerFailed` is raised. ``failed``: told of each failure
    first. The group is re-formed either by ``reform(death)`` right after it (a failed re-form ends the call)
    or by ``ready()`` before each attempt (a death there counts as one more)."""
    deaths = 0
    while True:
        try:
            if ready is not None:
                await ready()
            return await call()
        except TrainerFailed as exc:
            failed(exc)
            deaths += isinstance(exc, RankDied)
            if not isinstance(exc, RankDied) or stop or deaths > MAX_DEATHS_PER_CALL:
                raise
            if reform is not None:
                await reform(exc)


def reserve_ranks(ray: RayConfig, size: int, reforming: bool = False, what: str = "trainer.world_size") -> Placement:
    """Bundles for ``size`` trainer ranks as ``ray`` places them (``num_cpus_per_trainer``,
    ``num_gpus_per_trainer``, ``trainer_rank_resources``; packed onto as few nodes as hold them).
    ``reforming``: a rank whose ``trainer_rank_resources`` no alive node has any longer (its node was
    lost) asks for the default instead, so it can start where there is room. ``what``: the setting that
    asked for the ranks, for errors."""
    custom: list[dict[str, float]] = list(ray.trainer_rank_resources)
    if reforming and custom:
        custom = [c if _some_node_has(c) else {} for c in custom]
        for i, (asked, got) in enumerate(zip(ray.trainer_rank_resources, custom, strict=True)):
            if i < size and asked and not got:
                log.warning("trainer rank %d: no alive node has %s: it starts where there is room", i, asked)
    return Placement.reserve(f"{what}={size}", "rank", size, ray.num_cpus_per_trainer, ray.num_gpus_per_trainer,
                             "PACK", custom)


async def start_ranks(ranks: Sequence[Any], placement: Placement, timeout_s: float, what: str) -> list[dict[str, Any]]:
    """Every rank's ``setup`` once ``placement`` is ready (``timeout_s``), several ranks joining the process
    group rank 0's ``address`` hosts; their infos. ``what``: the call, for errors."""
    await placement.ready(timeout_s)
    master = (await every_rank([ranks[0].address.remote()], what))[0] if len(ranks) > 1 else None
    return await every_rank([r.setup.remote(master) for r in ranks], what)


def end_ranks(ranks: Sequence[Any], placement: Placement | None) -> None:
    """Every rank killed (without waiting for its calls) and their placement removed."""
    kill(ranks)
    with contextlib.suppress(Exception):
        placement.remove()


def close_ranks(ranks: Sequence[Any], placement: Placement | None) -> None:
    """Every rank's ``close`` (waited for 10 s at most), then :func:`end_ranks`."""
    import ray

    refs = [r.close.remote() for r in ranks]
    with contextlib.suppress(Exception):
        ray.wait(refs, num_returns=len(refs), timeout=10)
    end_ranks(ranks, placement)


async def every_rank(refs: Sequence[Any], what: str, infos: Sequence[dict[str, Any]] = (),
                     refusals: tuple[type[Exception], ...] = ()) -> list[Any]:
    """Every rank's result of the calls ``refs`` (one per rank, in rank order); the first rank to die or
    raise ends the call, without waiting for the others (which may be blocked in a collective with it):
    a death is :class:`RankDied`, a :class:`ConfigError` (or one of ``refusals``: what a call refuses
    before it changes anything) raised as it is, anything else :class:`TrainerFailed`, naming the rank
    (where it runs, from ``infos``) and ``what`` it was doing."""
    from ray.exceptions import RayTaskError

    futures = [asyncio.ensure_future(result(ref)) for ref in refs]
    try:
        await asyncio.wait(futures, return_when=asyncio.FIRST_EXCEPTION)
        await _peer_death(futures)
        for rank, fut in sorted(enumerate(futures), key=lambda f: not actor_died(f[1])):  # a death first
            if fut.done() and fut.exception() is not None:
                exc = fut.exception()
                info = infos[rank] if rank < len(infos) else {}
                where = f" (pid {info['pid']} on {info['host']})" if info else ""
                if isinstance(exc, ActorDied):
                    raise RankDied(f"trainer rank {rank}{where}", what, rank, exc.unavailable) from None
                cause = exc.cause if isinstance(exc, RayTaskError) and exc.cause is not None else exc
                if isinstance(cause, (ConfigError, *refusals)):
                    raise cause
                first = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
                raise TrainerFailed(f"trainer rank {rank}{where} failed during {what}: "
                                    f"{type(cause).__name__}: {first}") from None
        return [f.result() for f in futures]
    finally:
        for fut in futures:  # ranks still inside a call are killed by the group
            fut.cancel()


# A rank whose peer died raises from its collective ("Connection closed by peer") before Ray reports
# the death, which comes later when the peer's node is lost (the controller learns it from the
# node, not from a process exit): the failure waits this long for a death that explains it.
PEER_DEATH_GRACE_S = 30.0


def actor_died(fut: asyncio.Future[Any]) -> bool:
    return fut.done() and not fut.cancelled() and isinstance(fut.exception(), ActorDied)


async def _peer_death(futures: Sequence[asyncio.Future[Any]]) -> None:
    """After the first failure among ``futures``: when it is an exception a rank raised, wait up to
    :data:`PEER_DEATH_GRACE_S` for another rank's death (a re-formable failure) to be reported."""
    failed = any(f.done() and f.exception() is not None for f in futures)
    deadline = asyncio.get_running_loop().time() + PEER_DEATH_GRACE_S
    while failed and not any(actor_died(f) for f in futures):
        pending = [f for f in futures if not f.done()]
        left = deadline - asyncio.get_running_loop().time()
        if not pending or left <= 0:
            return
        await asyncio.wait(pending, timeout=left, return_when=asyncio.FIRST_EXCEPTION)


def _some_node_has(resources: dict[str, float]) -> bool:
    """Whether an alive node has ``resources`` (in all, used or not)."""
    import ray

    return any(n["Alive"] and all(n["Resources"].get(k, 0.0) >= v for k, v in resources.items())
               for n in ray.nodes())


def peer_holders(node_ids: Sequence[str | None]) -> dict[int, list[int]]:
    """Which rank pulls which ranks' copies after a step, so each copy is also on a second node: the
    ``p``-th rank of a node sends its copy to the ``p``-th rank (cyclically) of the next node (in
    the order the nodes first appear), which spreads the copies evenly over the ranks.
    ``node_ids``: each rank's node, in rank order (None: unknown, neither sends nor holds). On one
    node: none (the copies already are where the ranks are, and nothing changes)."""
    on: dict[str, list[int]] = {}
    for rank, node in enumerate(node_ids):
        if node is not None:
            on.setdefault(node, []).append(rank)
    nodes = list(on)
    holders: dict[int, list[int]] = {}
    if len(nodes) < 2:
        return holders
    for n, node in enumerate(nodes):
        peers = on[nodes[(n + 1) % len(nodes)]]
        for p, rank in enumerate(on[node]):
            holders.setdefault(peers[p % len(peers)], []).append(rank)
    return {h: sorted(holders[h]) for h in sorted(holders)}
