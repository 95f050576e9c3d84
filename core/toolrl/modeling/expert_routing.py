"""Mixture-of-experts routing, recorded and replayed through the router modules of transformers' MoE
models (the ``*TopKRouter`` classes: a forward from the flattened hidden states ``(N, H)`` to
``(router_logits, top-k weights, top-k expert ids)``; R2 and R3: docs/algorithms.md, "Mixture-of-experts
routing replay").

:class:`ExpertRouting` hooks every router of a model once. Each forward either **records** the expert ids
each router chose, ``(N, layers, top_k)`` in the order of the routers in the model, or **replays**
given ids: the router still computes its logits and softmax and the given experts' probabilities are
gathered (renormalised where the router renormalises its top-k), so only the selection is forced.

The hooks are forward hooks on the router modules, so they hold under FSDP2 (which wraps the
decoder layers) and under activation checkpointing (whose recomputation in backward runs the same
hooks: replay ids stay set until the next forward's are given).
"""

from __future__ import annotations

from typing import Any

import torch


def routers(model: Any) -> list[torch.nn.Module]:
    """The top-k router modules of ``model`` in module order (one per sparse layer); [] for a dense
    model."""
    return [m for m in model.modules() if type(m).__name__.endswith("TopKRouter")]


class ExpertRouting:
    """Record or replay the expert selection of every router of ``model`` (module docstring).

    ``replay(ids)`` before a forward makes it use ``ids`` (``(N, layers, top_k)``, N the tokens the
    forward runs on, in its flattened order; with ``expand``, the forward runs on ``ids[expand]``
    instead when its token count says so: a prefix-shared row run unshared); ``replay(None)`` makes it
    record, after which :meth:`recorded` gives the ids its routers chose. A replaying forward keeps in
    ``flips`` (N,) which tokens its routers would have sent elsewhere in at least one layer."""

    def __init__(self, model: Any) -> None:
        self.routers = routers(model)
        if not self.routers:
            raise ValueError(f"{type(model).__name__} has no mixture-of-experts router to record or replay")
        self.num_experts = int(self.routers[0].num_experts)
        self.ids: torch.Tensor | None = None
        self.expand: torch.Tensor | None = None
        self.flips: torch.Tensor | None = None
        self.chosen: list[torch.Tensor | None] = [None] * len(self.routers)
        self.handles = [r.register_forward_hook(self._hook(i)) for i, r in enumerate(self.routers)]

    @property
    def layers(self) -> int:
        return len(self.routers)

    def replay(self, ids: torch.Tensor | None, expand: torch.Tensor | None = None) -> None:
        self.ids, self.expand, self.flips = ids, expand, None
        self.chosen = [None] * len(self.routers)

    def recorded(self) -> torch.Tensor:
        """The ids the last recording forward chose, ``(N, layers, top_k)`` long."""
        if any(c is None for c in self.chosen):
            raise RuntimeError("no recorded forward reached every router")
        return torch.stack([c for c in self.chosen if c is not None], dim=1)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()

    def _hook(self, layer: int) -> Any:
        def hook(module: torch.nn.Module, args: Any, out: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> Any:
            logits, weights, chosen = out
            if self.ids is None:
                self.chosen[layer] = chosen.detach()
                return None
            forced = self.ids[:, layer].to(device=chosen.device, dtype=chosen.dtype)
            if self.expand is not None and forced.shape[0] != chosen.shape[0] == self.expand.numel():
                forced = forced[self.expand.to(forced.device)]
            if forced.shape != chosen.shape:
                raise ValueError(f"routing replay: {tuple(forced.shape)} expert ids for a router that chose "
                                 f"{tuple(chosen.shape)}")
            flips = (chosen.sort(-1).values != forced.sort(-1).values).any(-1)
            self.flips = flips if self.flips is None else self.flips | flips
            probs = torch.softmax(logits.float(), dim=-1).gather(-1, forced)
            if getattr(module, "norm_topk_prob", True):  # Mixtral's router always renormalises
                probs = probs / probs.sum(dim=-1, keepdim=True)
            return logits, probs.to(weights.dtype), forced

        return hook
