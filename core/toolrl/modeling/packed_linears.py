"""A model's linear layers through oneDNN on weights packed for it (``engine.options.packed_linears``), in
the forwards their owner (the engine's step runner) runs inside :meth:`PackedLinears.applied`.

On one CPU thread a float32 ``F.linear`` of 2 to 8 rows runs far under the memory speed a 1-row product
reaches (SmolLM2-135M's linears: 72 ms for 4 rows, 48 for 1); oneDNN's inner product on a weight
reordered once into its blocked layout takes 49 ms for 4 (``benchmarks/packed_linears.py``). One row
keeps ``F.linear`` (as fast, and a one-row sample's bits stay the dense model's). Inside ``applied()``
each packed layer's forward is the object's, outside it its own: no class or parameter changes, and
none of the cost of a ``TorchFunctionMode`` whose handler runs for every torch call (the benchmark
prints both). A layer's packed copy, held by the object, is made on its first forward of 2+ rows and
again once the weight is written in place or replaced; dropped while the engine sleeps. Forwards that
record gradients take ``F.linear`` on the weight itself; LoRA's ``A`` and ``B`` stay plain.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F

# The row count oneDNN's layout is chosen for: packs for 4, 8 and 32 rows ran every row count from 2 to
# 128 within noise of each other here (a timing script, not committed; docs/benchmarks.md).
_PACKED_FOR_ROWS = 4


def onednn_linear() -> tuple[Callable[[torch.Tensor], torch.Tensor], Callable[..., torch.Tensor]]:
    """torch's private oneDNN ops, the one place they are named: (a weight packed, rows times a packed
    weight plus a bias). Raises ValueError (one line) where torch lacks them."""
    names = ("_reorder_linear_weight", "_linear_pointwise")
    if not torch.backends.mkldnn.is_available() or not all(hasattr(torch.ops.mkldnn, n) for n in names):
        raise ValueError(f"packed_linears: true needs torch built with oneDNN and its ops torch.ops.mkldnn."
                         f"{' and '.join(names)}, which torch {torch.__version__} here lacks")
    reorder, pointwise = torch.ops.mkldnn._reorder_linear_weight, torch.ops.mkldnn._linear_pointwise
    return (lambda w: reorder(w, _PACKED_FOR_ROWS)), (lambda x, w, bias: pointwise(x, w, bias, "none", [], ""))


class PackedLinears:
    """Every plain ``nn.Linear`` of ``model`` but LoRA's ``A`` and ``B`` (``layers``, chosen when made:
    adapters injected later wrap them and keep them) on packed weights inside :meth:`applied`. Raises
    ValueError where the model's weights are not float32 on a CPU, or torch has no oneDNN."""

    def __init__(self, model: torch.nn.Module) -> None:
        weight = next(model.parameters())
        self.check(weight.device.type, str(weight.dtype).removeprefix("torch."))
        self._pack, self._product = onednn_linear()
        lora = {id(m) for layer in model.modules() if isinstance(getattr(layer, "lora_A", None), torch.nn.ModuleDict)
                for m in (*layer.lora_A.values(), *layer.lora_B.values())}
        self.layers = [m for m in model.modules()  # (a forward replaced already, as accelerate's hooks do, stays)
                       if type(m) is torch.nn.Linear and id(m) not in lora and "forward" not in m.__dict__]
        self._forwards = [functools.partial(self._forward, m) for m in self.layers]
        # By layer: the weight's (storage, version) when packed, and the packed copy.
        self._copies: dict[int, tuple[tuple[int, int], torch.Tensor]] = {}

    @staticmethod
    def check(device: str, dtype: str) -> None:  # device: a torch device type
        if device != "cpu" or dtype != "float32":
            raise ValueError(f"packed_linears: true takes a CPU engine with float32 weights, this one has {dtype} "
                             f"weights on {device}")

    @property
    def copies(self) -> int:  # how many layers' packed copies are held now
        return len(self._copies)

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        """Run the forwards inside on packed weights (each layer's weight as it is then: a replaced one too)."""
        for layer, forward in zip(self.layers, self._forwards, strict=True):
            object.__setattr__(layer, "forward", forward)  # an instance's forward: what Module.__call__ runs
        try:
            yield
        finally:
            for layer in self.layers:
                object.__delattr__(layer, "forward")

    def drop(self) -> None:  # the next forward of 2+ rows packs again
        self._copies.clear()

    def _forward(self, layer: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
        """``layer``'s forward through oneDNN where it records no gradient and ``x`` holds 2+ rows."""
        w = layer.weight
        if x.numel() < 2 * layer.in_features or (torch.is_grad_enabled() and (w.requires_grad or x.requires_grad)):
            return F.linear(x, w, layer.bias)
        key = (w.data_ptr(), w._version)
        kept = self._copies.get(id(layer))
        if kept is None or kept[0] != key:
            kept = self._copies[id(layer)] = (key, self._pack(w.detach()))
        return self._product(x, kept[1], layer.bias)
