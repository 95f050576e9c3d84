"""The public step on several ranks, for a trainer outside toolrl's loop (the Tinker service's, yours):
``world_size`` :class:`~toolrl.processes.step_rank.StepRank` s as Ray actors in one ``torch.distributed``
group, the frozen base sharded with FSDP2, every adapter and its AdamW replicated on every rank. The
calls are a :class:`StepRank`'s, made on every rank at once; a ``forward_backward`` gives each rank a
contiguous share of the rows and gives back the one-rank step's results, up to float32 summation order.

A lost rank ends the call in flight at once; the group keeps, per adapter, its state after its last
optimizer step and the backward calls since, so a new group is made in the same state and the call
made again (at most :data:`~toolrl.processes.recovery.MAX_DEATHS_PER_CALL` deaths a call); a rank that
raised fails the call with :class:`~toolrl.processes.recovery.TrainerFailed`. Placement, sharding,
recovery: docs/training_api.md, "Several ranks".

Every method blocks (from async code: in a thread); calls run one at a time. ``ray`` is imported inside
the methods.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, TypeVar

from toolrl.algorithms import build_loss
from toolrl.config import AdapterConfig, AlgorithmConfig, RayConfig
from toolrl.processes.recovery import (
    RankDied,
    Recovery,
    TrainerFailed,
    close_ranks,
    end_ranks,
    every_rank,
    recovering,
    reserve_ranks,
    start_ranks,
)
from toolrl.processes.step_rank import StepRank
from toolrl.ray_cluster import init_ray
from toolrl.training.optimizer import OptimizerSettings
from toolrl.training.token_step import LossSpec, StepOutput, TokenRow, check_ids, micro_batch_spans

__all__ = ["StepGroup"]

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class _Kept:
    """What re-makes an adapter on a new group: how it was added, its state after its last optimizer step
    (None: as added), its gradients when they were last set, and the backward calls since (rows, loss,
    max_tokens)."""

    config: AdapterConfig
    seed: int | None
    state: dict[str, Any] | None = None
    grads: dict[str, Any] | None = None
    since: list[tuple[Sequence[TokenRow], LossSpec, int | None]] = field(default_factory=list)


class StepGroup:
    """``world_size`` ranks of the base model at ``source`` (a model directory) on the Ray cluster at
    ``ray.address`` (connected to when this process is not yet: "local" starts one), each holding at
    most ``slots`` adapters in the model (:class:`StepRank`). Call :meth:`start` first, :meth:`close` last."""

    def __init__(self, source: str, world_size: int, ray: RayConfig | None = None, *, slots: int | None = None,
                 collective_timeout_s: float = 600.0) -> None:
        self.source, self.world_size, self.slots = source, world_size, slots
        self.ray = ray if ray is not None else RayConfig(address="local")
        self.collective_timeout_s = collective_timeout_s
        self.device = "cuda" if self.ray.num_gpus_per_trainer > 0 else "cpu"
        self.placement: Any = None
        self.ranks: list[Any] = []
        self.infos: list[dict[str, Any]] = []
        self.kept: dict[str, _Kept] = {}
        self.recoveries: list[Recovery] = []  # every re-formed group, oldest first
        # Why the group must be re-formed before its next call, and who failed (a Recovery's ``died``).
        self._broken: tuple[str, str] | None = None
        self._lock = threading.Lock()
        self._own_ray = False
        self._start_timeout_s = 900.0

    @property
    def info(self) -> dict[str, Any]:
        """Rank 0's :meth:`StepRank.setup`: the model's ``arch``, ``vocab`` and ``context``, where it runs."""
        return self.infos[0]

    @staticmethod
    def connect(ray: RayConfig, world_size: int) -> bool:
        """Connect this process to the Ray cluster at ``ray.address`` ("local": start one on this machine
        with room for ``world_size`` ranks) unless it is connected; whether it connected now. Call it from
        the main thread: a Ray started from another one leaves its agents running after it stops."""
        import ray as ray_module

        if ray_module.is_initialized():
            return False
        init_ray(ray.address or "local", world_size * ray.num_cpus_per_trainer, log_to_driver=False)
        return True

    def start(self, timeout_s: float = 900.0) -> dict[str, Any]:
        """Connect to Ray (:meth:`connect`; shut down again at :meth:`close`), place and start the ranks
        (``timeout_s``: for their placement; a re-formed group's too); :attr:`info`."""
        self._start_timeout_s = timeout_s
        self._own_ray = self.connect(self.ray, self.world_size)
        with self._lock:
            asyncio.run(self._new_ranks(timeout_s))
        return self.info

    # ----------------------------------------------------------------- the ranks' calls

    def add_adapter(self, name: str, config: AdapterConfig, seed: int | None = None) -> None:
        if name in self.kept:
            raise ValueError(f"adapter {name!r} exists already")
        self._run(f"adding adapter {name}", lambda: self._each("add_adapter", name, config, seed))
        self.kept[name] = _Kept(config, seed)

    def remove_adapter(self, name: str) -> None:
        self._known(name)
        self._run(f"removing adapter {name}", lambda: self._each("remove_adapter", name))
        del self.kept[name]

    def forward_backward(self, name: str, rows: Sequence[TokenRow], loss: LossSpec, *, backward: bool = True,
                         max_tokens: int | None = None) -> StepOutput:
        """:meth:`StepRank.forward_backward` of every row, each rank on its share; refusals (an unknown
        adapter, loss or option, a token id outside the vocabulary) are raised here, before any rank runs."""
        self._known(name)
        if not rows:
            raise ValueError("forward_backward: no rows")
        build_loss(AlgorithmConfig(loss=loss.name, loss_options=loss.options, loss_agg="seq-mean-token-sum-norm"))
        check_ids(rows, self.info["vocab"])
        out = self._run(f"forward_backward of {name}", lambda: self._forward_backward(name, rows, loss, backward, max_tokens))
        if backward:
            self.kept[name].since.append((list(rows), loss, max_tokens))
        return out

    def optimizer_step(self, name: str, settings: OptimizerSettings) -> float:
        self._known(name)

        async def step() -> tuple[float, dict[str, Any]]:
            norms = await self._each("optimizer_step", name, settings)
            return norms[0], (await self._each("state", name, ranks=self.ranks[:1]))[0]

        norm, state = self._run(f"optimizer step of {name}", step)
        self.kept[name].state, self.kept[name].grads, self.kept[name].since = state, None, []
        return norm

    def state(self, name: str, optimizer: bool = True) -> dict[str, Any]:
        self._known(name)
        return self._run(f"reading {name}", lambda: self._each("state", name, optimizer, ranks=self.ranks[:1]))[0]

    def gradients(self, name: str) -> dict[str, Any]:
        self._known(name)
        return self._run(f"reading {name}", lambda: self._each("gradients", name, ranks=self.ranks[:1]))[0]

    def set_gradients(self, name: str, grads: Mapping[str, Any]) -> None:
        """:meth:`StepRank.set_gradients` on every rank (an adapter's gradient is the same on each)."""
        self._known(name)
        self._run(f"setting {name}'s gradients", lambda: self._each("set_gradients", name, grads))
        self.kept[name].grads, self.kept[name].since = dict(grads), []

    def memory(self) -> dict[str, int]:
        """:meth:`StepRank.memory` of rank 0 (each rank holds as much)."""
        return self._run("reading memory", lambda: self._each("memory", ranks=self.ranks[:1]))[0]

    def load_state(self, name: str, adapter: Mapping[str, Any], optimizer: Mapping[str, Any] | None = None) -> None:
        """:meth:`StepRank.load_state` on every rank; a state that does not fit raises ValueError, nothing changed."""
        self._known(name)
        self._run(f"loading {name}", lambda: self._each("load_state", name, adapter, optimizer, refusals=(ValueError,)))
        kept = self.kept[name]
        kept.state, kept.grads, kept.since = {"adapter": dict(adapter), "optimizer": optimizer}, None, []

    def close(self) -> None:
        close_ranks(self.ranks, self.placement)
        if self._own_ray:
            import ray

            ray.shutdown()

    # ----------------------------------------------------------------- fan-out

    def _known(self, name: str) -> None:
        if name not in self.kept:
            raise ValueError(f"no adapter {name!r}: this trainer holds {', '.join(self.kept) or 'none'}")

    async def _each(self, method: str, *args: Any, ranks: Sequence[Any] | None = None,
                    refusals: tuple[type[Exception], ...] = ()) -> list[Any]:
        """``method(*args)`` on every rank (or ``ranks``); their results."""
        ranks = self.ranks if ranks is None else ranks
        return await every_rank([getattr(r, method).remote(*args) for r in ranks], method.replace("_", " "), self.infos,
                                refusals)

    async def _forward_backward(self, name: str, rows: Sequence[TokenRow], loss: LossSpec, backward: bool,
                                max_tokens: int | None) -> StepOutput:
        cuts = shares([len(row.tokens) for row in rows], len(self.ranks))
        pieces = [list(rows[a:b]) for a, b in zip(cuts, cuts[1:], strict=False)]
        forwards = max(len(micro_batch_spans([len(r.tokens) for r in p], max_tokens)) if p else 0 for p in pieces)
        outs = await every_rank([r.forward_backward.remote(name, piece, loss, backward=backward, max_tokens=max_tokens,
                                                           forwards=forwards)
                                 for r, piece in zip(self.ranks, pieces, strict=True)], "forward backward", self.infos)
        return StepOutput(logprobs=[lp for out in outs for lp in out.logprobs], loss=sum(out.loss for out in outs),
                          tokens=sum(out.tokens for out in outs), micro_batches=sum(out.micro_batches for out in outs))

    # ----------------------------------------------------------------- a lost rank

    def _run(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """``call()`` (:func:`~toolrl.processes.recovery.recovering`), on a group re-formed first when the
        last call, or the last attempt of this one, broke it."""
        with self._lock:
            return asyncio.run(recovering(call, ready=lambda: self._reform(what), failed=self._broke))

    def _broke(self, failure: TrainerFailed) -> None:
        # A rank that raised breaks the group too: the others may wait in a collective with it.
        self._broken = str(failure), failure.who if isinstance(failure, RankDied) else "a failed call"

    async def _new_ranks(self, timeout_s: float) -> None:
        import ray

        self.placement = reserve_ranks(self.ray, self.world_size, reforming=bool(self.ranks),
                                       what="the step group's world_size")
        actor = ray.remote(StepRank)
        self.ranks = [actor.options(**self.placement.options(r)).remote(
            self.source, r, self.world_size, self.device, self.slots, self.collective_timeout_s)
            for r in range(self.world_size)]
        self.infos = []
        self.infos = await start_ranks(self.ranks, self.placement, timeout_s, "setup")

    async def _reform(self, what: str) -> None:
        """When the group is broken: every rank killed, a new group placed and started, each adapter restored
        and its calls since its last step run again."""
        if self._broken is None:
            return
        seen, t0 = time.time(), time.perf_counter()
        why, who = self._broken
        log.warning("%s: re-forming the step group of %d ranks", why, self.world_size)
        end_ranks(self.ranks, self.placement)
        await self._new_ranks(self._start_timeout_s)
        calls = 0
        for name, kept in self.kept.items():
            await self._each("add_adapter", name, kept.config, kept.seed)
            if kept.state is not None:
                await self._each("load_state", name, kept.state["adapter"], kept.state["optimizer"])
            if kept.grads is not None:
                await self._each("set_gradients", name, kept.grads)
            for rows, loss, max_tokens in kept.since:
                await self._forward_backward(name, rows, loss, True, max_tokens)
            calls += len(kept.since)
        self._broken = None
        record = Recovery(who, what, "replace", self.world_size, self.world_size,
                          f"memory ({len(self.kept)} adapters, {calls} calls since their last step run again)",
                          time.perf_counter() - t0, time=seen, what="step_rank",
                          ranks=[{k: i.get(k) for k in ("rank", "pid", "host", "node_id")} for i in self.infos])
        self.recoveries.append(record)
        log.warning("step group re-formed: %d ranks from %s in %.1f s", self.world_size, record.source, record.recovery_s)


def shares(lengths: Sequence[int], parts: int) -> list[int]:
    """Where to cut rows of these token ``lengths`` into ``parts`` contiguous shares of near-equal tokens:
    ``parts + 1`` row indices from 0 to ``len(lengths)`` (a share may be empty)."""
    bounds = list(accumulate(lengths, initial=0))
    cuts = [0]
    for k in range(1, parts):
        goal = bounds[-1] * k / parts
        cuts.append(max(cuts[-1], min(range(len(bounds)), key=lambda i: abs(bounds[i] - goal))))
    return [*cuts, len(lengths)]
