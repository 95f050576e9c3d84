"""Several LoRA adapters on one base model, each token through its own (``model.adapters``): the one
routing the trainer and the transformers engine share. Each adapter
:func:`toolrl.modeling.adapters.add_adapter` injects is routed (:func:`route_adapters`): peft's own sum
off, every LoRA layer's forward hook adding each token's own adapter's delta to the base output. The
hook reads the forward's :func:`routed` context, so **every forward of such a model runs inside**
``routed(model, adapter_ids)``; one outside it raises (it would run the base model silently, and train
nothing). ``-1`` routes to the base weights alone. Gradient checkpointing's backward re-runs the
forward: call it inside the context too. An adapter with no token in the forward is not read, so its
``.grad`` stays None after backward.

Per layer the delta takes one of three paths, equal up to the summation order: one adapter for every
token (peft's own); without gradients and with groups of similar size (the padding at most doubles the
tokens), grouped: two batched matmuls over the adapters' stacked ``A`` and ``B`` whatever their number;
otherwise (training, dropout, uneven groups) per adapter, its tokens gathered and added back. Why the
grouped path: docs/architecture.md "adapters per row". The routing state lives on the model's LoRA
layers, so one routed forward runs at a time on a model. ``torch`` and ``peft`` are imported inside.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# The attribute each routed LoRA layer holds: the _Route of the forward in progress, None outside one.
_ROUTE = "_toolrl_route"
# Its stacked weights kept between routed forwards without gradients: (key, A^T [k, in, r], scaled B^T [k, r, out]).
_STACK = "_toolrl_stack"
# The model's routed layers, kept on it by route_adapters (a walk of a model with several adapters
# passes thousands of modules: each adapter's A, B and dropout are modules of their own).
_LAYERS = "_toolrl_routed_layers"
# A forward of at most this many tokens takes the grouped path whatever its padding; a larger one while its
# padded groups hold at most PAD_RATIO times its routed tokens, else the per-adapter path.
GROUPED_ANY_TOKENS = 64
PAD_RATIO = 2


def adapter_names(model: torch.nn.Module) -> list[str]:
    """The model's LoRA adapters, in injection order: ``adapter_ids`` value i of :func:`routed` is
    the i-th (``["default"]`` for ``model.lora``; empty without adapters)."""
    return list(getattr(model, "peft_config", None) or ())


def route_adapters(model: torch.nn.Module) -> None:
    """Switch ``model`` to routed forwards (:func:`toolrl.modeling.adapters.add_adapter` does, after each
    adapter it injects): peft's own sum of active adapters off, the routing hook on every LoRA layer
    that lacks it (one injected beside the others may adapt modules they do not). Leaves every adapter
    parameter's ``requires_grad`` False; the caller sets the trained ones'."""
    from peft.tuners.lora import LoraLayer

    layers = [m for m in model.modules() if isinstance(m, LoraLayer)]
    for layer in layers:
        layer.set_adapter([], inference_mode=True)  # no active adapter: peft's forward is the base layer's
        if _ROUTE not in layer.__dict__:
            object.__setattr__(layer, _ROUTE, None)
            object.__setattr__(layer, _STACK, None)
            layer.register_forward_hook(_add_routed_delta)
    object.__setattr__(model, _LAYERS, layers)


def has_routing(model: torch.nn.Module) -> bool:
    """Whether ``model``'s forwards are routed (:func:`route_adapters`): it holds adapters per role."""
    return bool(_routed_layers(model))


def _routed_layers(model: torch.nn.Module) -> list[Any]:
    """The routed LoRA layers: kept on the model, or found in it (a wrapper of the model)."""
    kept = model.__dict__.get(_LAYERS)
    return kept if kept is not None else [m for m in model.modules() if _ROUTE in m.__dict__]


@contextlib.contextmanager
def routed(model: torch.nn.Module, adapter_ids: torch.Tensor, *, keep_stacked: bool = False) -> Iterator[None]:
    """Route the forwards run inside to each token's (or row's) adapter.

    ``adapter_ids``: a LongTensor shaped as the forward's ``input_ids`` ``[B, T]`` (a token each) or
    as its rows ``[B]``, on the model's device; value i selects ``adapter_names(model)[i]``, -1 the
    base weights only. ``keep_stacked``: the grouped path keeps its stacked weights
    on the layers, checked by each parameter's version and storage: for a model whose weights are
    written in place or replaced as whole parameters (an engine's), not one whose parameters change
    under it otherwise (FSDP's gathered ones). Raises ValueError on a model not given adapters by
    ``add_adapter`` or on an id out of range, RuntimeError when a routed forward of this model is
    already in progress.
    """
    layers = _routed_layers(model)
    if not layers:
        raise ValueError("routed: the model has no routed adapters (toolrl.modeling.adapters.add_adapter gives them)")
    if any(layer.__dict__[_ROUTE] is not None for layer in layers):
        raise RuntimeError("routed: a routed forward of this model is already in progress")
    route = _Route(adapter_names(model), adapter_ids, keep_stacked)
    for layer in layers:
        object.__setattr__(layer, _ROUTE, route)
    try:
        yield
    finally:
        for layer in layers:
            object.__setattr__(layer, _ROUTE, None)


class RowAdapters:
    """A model's adapters per role as an engine's rows carry them: a request names its adapter, and every
    forward routes each row through the one of that name (looked up then, so a row keeps its adapter when
    others are added or removed at run time; ``keep_stacked``: the engine writes its weights in place or
    replaces them). A model without adapters per role has none: its rows name None and run unrouted."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model, self.device = model, next(model.parameters()).device
        self.names = adapter_names(model) if has_routing(model) else []

    def index(self, adapter: str | None) -> int:
        """``adapter``'s index among the names (-1 for None on a model without them)."""
        if not self.names:
            if adapter is not None:
                raise ValueError(f"adapter {adapter!r}: the engine's model has no LoRA adapter per role")
            return -1
        if adapter not in self.names:
            asked = "no adapter" if adapter is None else f"unknown adapter {adapter!r}"
            raise ValueError(f"{asked}: the engine serves an adapter per role: {', '.join(self.names)}")
        return self.names.index(adapter)

    def forward(self, rows: list[str | None]) -> contextlib.AbstractContextManager[None]:
        """The context of a forward whose row i runs through adapter ``rows[i]`` (a name, or None)."""
        if not self.names:
            return contextlib.nullcontext()
        import torch

        ids = torch.tensor([self.index(a) for a in rows], device=self.device)
        return routed(self.model, ids, keep_stacked=True)

    def one_policy(self, work: str, adapter: str | None) -> None:
        """Check ``adapter`` for ``work`` that runs every row under one policy: on a model with adapters
        per role, one must be named."""
        if self.names and adapter is None:
            raise NotImplementedError(f"the transformers engine {work} under one policy, and this one serves "
                                      f"an adapter per role ({', '.join(self.names)}): name one")
        self.index(adapter)


def _add_routed_delta(layer: Any, args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
    """The forward hook of a routed LoRA layer: its base output plus each token's adapter delta."""
    route = layer.__dict__[_ROUTE]
    if route is None:
        raise RuntimeError(f"a model with LoRA adapters per role ({', '.join(layer.lora_A)}) runs its "
                           "forwards inside toolrl.modeling.adapter_routing.routed(model, adapter_ids)")
    return route.add_delta(layer, args[0], output)


class _Route:
    """One routed context: the ids, which adapters have tokens, and what is derived from them once
    for all layers (each adapter's token positions, the stacked path's masks)."""

    def __init__(self, names: list[str], ids: torch.Tensor, keep_stacked: bool) -> None:
        import torch

        if ids.dtype not in (torch.int64, torch.int32) or ids.dim() not in (1, 2):
            raise ValueError(f"routed: adapter_ids must be an integer tensor [B] or [B, T], got {ids.dtype} "
                             f"{list(ids.shape)}")
        self.names, self.ids, self.keep_stacked = names, ids.long(), keep_stacked
        k = len(names)
        flat = self.ids.flatten()
        # Bins: 0 below -1, 1 base, 2.. the adapters, k + 2 beyond them; one copy to the host for all.
        counts = torch.bincount((flat + 2).clamp(0, k + 2), minlength=k + 3).tolist()
        if counts[0] or counts[k + 2]:
            raise ValueError(f"routed: adapter_ids hold values outside -1 .. {k - 1} (adapters {names})")
        self.base_tokens = counts[1]
        self.present = [names[i] for i in range(k) if counts[i + 2]]
        self._counts = dict(zip(names, counts[2:], strict=False))
        self._flat = flat
        self._positions: dict[str, torch.Tensor] = {}
        self._groups: dict[tuple[str, ...], Any] = {}

    def add_delta(self, layer: Any, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        lora_a = layer.lora_A
        here = [n for n in self.present if n in lora_a]
        if not here:
            return out
        d = self.ids.dim()
        if x.shape[:d] != self.ids.shape:
            raise ValueError(f"routed: a LoRA layer's input is {list(x.shape)}, which adapter_ids "
                             f"{list(self.ids.shape)} do not route (they are shaped as input_ids or its rows)")
        if len(here) == len(self.present) == 1 and not self.base_tokens:  # every token through one adapter
            return out + _delta(layer, here[0], x).to(out.dtype)
        x2, out2 = x.flatten(0, d - 1), out.flatten(0, d - 1)
        import torch

        per = x2[0].numel() // x2.shape[-1]  # tokens an id routes (a row's, under ids [B])
        if (not torch.is_grad_enabled() and not (layer.training and any(_dropping(layer, n) for n in here))
                and (groups := self._grouped(tuple(here), per)) is not None):
            index, positions, kept = groups  # each token times its own adapter's A and B: two batched matmuls
            a, b = self._stacked(layer, here)
            xg = x2.to(a.dtype).index_select(0, index.flatten()).view(len(here), -1, x2.shape[-1])  # [k, m (x row), in]
            delta = torch.bmm(torch.bmm(xg, a), b).view(-1, *x2.shape[1:-1], b.shape[-1])
            delta = (delta if kept is None else delta.index_select(0, kept)).to(out2.dtype)
            return out2.index_add_(0, positions, delta).view(out.shape)  # the base output is this layer's own
        for name in here:  # per adapter: its tokens out, its delta back in at their places
            rows = self._rows(name)
            out2 = out2.index_add(0, rows, _delta(layer, name, x2.index_select(0, rows)).to(out2.dtype))
        return out2.view(out.shape)

    def _rows(self, name: str) -> torch.Tensor:
        """Positions in the flattened ids of ``name``'s tokens."""
        if name not in self._positions:
            self._positions[name] = (self._flat == self.names.index(name)).nonzero()[:, 0]
        return self._positions[name]

    def _grouped(self, here: tuple[str, ...], per: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None:
        """The grouped path's gathers for the ids of adapters ``here`` (each routing ``per`` tokens): ``[k, m]``
        positions in the flattened ids (each adapter's, padded with its first), their positions without the
        padding, and which of the ``k * m`` products to keep (None: all); None where the padding would more
        than double the tokens."""
        import torch

        if here not in self._groups:
            sizes = [self._counts[n] for n in here]
            m, ids = max(sizes), sum(sizes)
            if ids * per > GROUPED_ANY_TOKENS and len(here) * m > PAD_RATIO * ids:
                self._groups[here] = None
            else:
                rows = [self._rows(n) for n in here]
                index = torch.stack([torch.cat([r, r[:1].expand(m - len(r))]) for r in rows])
                kept = None if min(sizes) == m else torch.cat([torch.arange(len(r), device=r.device) + i * m
                                                               for i, r in enumerate(rows)])
                self._groups[here] = (index, torch.cat(rows), kept)
        return self._groups[here]

    def _stacked(self, layer: Any, here: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """The adapters ``here``'s ``A^T`` stacked ``[k, in, r]`` and ``B^T`` times the scaling ``[k, r, out]``,
        ranks padded with zeros to the largest; with ``keep_stacked``, kept on the layer until one of them is
        written in place or replaced."""
        import torch
        import torch.nn.functional as F

        weights = [(layer.lora_A[n].weight, layer.lora_B[n].weight, layer.scaling[n]) for n in here]
        key = (*here, *((t._version, t.data_ptr(), t.dtype) for a, b, _ in weights for t in (a, b)))
        kept = layer.__dict__[_STACK] if self.keep_stacked else None
        if kept is None or kept[0] != key:
            r = max(a.shape[0] for a, _, _ in weights)
            kept = (key, torch.stack([F.pad(a, (0, 0, 0, r - a.shape[0])).T for a, _, _ in weights]),
                    torch.stack([F.pad(b * s, (0, r - b.shape[1])).T for _, b, s in weights]))
            if self.keep_stacked:
                object.__setattr__(layer, _STACK, kept)
        return kept[1], kept[2]


def _delta(layer: Any, name: str, x: torch.Tensor) -> torch.Tensor:
    """peft's delta of adapter ``name`` on ``x``: ``B(A(dropout(x))) * scaling``, in the adapter's dtype."""
    a = layer.lora_A[name]
    return layer.lora_B[name](a(layer.lora_dropout[name](x.to(a.weight.dtype)))) * layer.scaling[name]


def _dropping(layer: Any, name: str) -> bool:
    """Whether adapter ``name``'s input dropout is live (training, p > 0): the stacked path has none."""
    drop = layer.lora_dropout[name]
    return bool(drop.training and getattr(drop, "p", 0.0) > 0)
