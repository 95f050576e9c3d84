"""Routing replay in the policy step (``algorithm.routing_replay``: ``r3`` the engine's choices, packed
into ``PackedBatch.routed_experts`` in the row's order; ``r2`` the trainer's own first forward over the
micro-batch, for every later forward of it; docs/algorithms.md). Either way the router's softmax is
recomputed at the forced experts (:mod:`toolrl.modeling.expert_routing`), so the router keeps its
gradient. Under sequence parallelism each rank replays its own slice of the row
(:func:`toolrl.training.sequence_parallel.local_span`)."""

from __future__ import annotations

from typing import Any

import torch

from toolrl.config import ConfigError
from toolrl.modeling.expert_routing import ExpertRouting
from toolrl.training.packing import PackedBatch
from toolrl.training.sequence_parallel import SequenceParallel, local_span


def model_routing(model: Any) -> ExpertRouting:
    """``model``'s router hooks, installed once (kept on the model)."""
    routing = getattr(model, "toolrl_routing", None)
    if routing is None:
        try:
            routing = ExpertRouting(model)
        except ValueError as exc:
            raise ConfigError(f"algorithm.routing_replay: {exc}") from None
        model.toolrl_routing = routing
    return routing


class ExpertReplay:
    """Sets the routing of each policy forward of one step (module docstring): :meth:`before` and
    :meth:`after` around it; :meth:`close` leaves the routers routing on their own."""

    def __init__(self, model: Any, mode: str, sp: SequenceParallel | None) -> None:
        self.routing = model_routing(model)
        self.mode, self.sp = mode, sp
        self.first: dict[int, torch.Tensor] = {}  # r2: by id(batch), the experts of its first forward
        self.counted: set[int] = set()  # r3: batches whose routing flips are counted (on their first forward)
        self.flipped = self.tokens = 0

    def before(self, batch: PackedBatch, dummy: bool = False) -> None:
        if self.mode == "r2":
            self.routing.replay(self.first.get(id(batch)))
        elif dummy:  # a zero-weight step: its one pad token routes on its own
            self.routing.replay(None)
        elif batch.routed_experts is None:
            raise ValueError("algorithm.routing_replay=r3: a trajectory of the batch has no recorded experts "
                             "(engine.options.record_routes)")
        else:
            self.routing.replay(self.local(batch.routed_experts), batch.expand if self.sp is None else None)

    def after(self, batch: PackedBatch) -> None:
        flips = self.routing.flips
        if self.mode == "r3" and flips is not None and id(batch) not in self.counted:
            self.counted.add(id(batch))
            self.flipped += int(flips.sum())
            self.tokens += flips.numel()
        if self.mode == "r2" and id(batch) not in self.first:
            self.first[id(batch)] = self.routing.recorded()
            self.routing.replay(self.first[id(batch)])  # a recomputation in backward routes as this pass did

    def local(self, experts: torch.Tensor) -> torch.Tensor:
        """This rank's rows of ``experts`` (the whole row without sequence parallelism)."""
        if self.sp is None:
            return experts
        lo, hi = local_span(experts.shape[0], self.sp)
        pad = max(0, hi - experts.shape[0])
        filler = torch.arange(experts.shape[2], device=experts.device).expand(pad, *experts.shape[1:])
        return torch.cat([experts, filler])[lo:hi]

    def metrics(self) -> dict[str, float]:
        """r3: ``routing_mismatch_frac``, the share of the tokens this rank ran whose experts, chosen by
        the trainer's own router, would differ from the engine's in at least one layer."""
        return {"routing_mismatch_frac": self.flipped / self.tokens} if self.tokens else {}

    def close(self) -> None:
        self.routing.replay(None)
        self.first.clear()
