"""A CPU engine's linear layers through oneDNN on weights packed for it (``engine.options.packed_linears``).

On one CPU thread a float32 ``F.linear`` of 2 to 8 rows runs MKL's general matrix multiply far under the
memory speed a 1-row product reaches: SmolLM2-135M's linears take 72 ms for 4 rows against 48 ms for 1,
and 2 and 3 rows longer than 4 (``benchmarks/packed_linears.py``). oneDNN's inner product on a weight
reordered once into its blocked layout takes 49 ms for 4 rows and beats ``F.linear`` from 2 rows up
(prefills of 128 rows: 341 against 412 ms). One row keeps ``F.linear`` (as fast, and a one-row sample's
bits stay those of the dense model's).

Each packed layer holds a second copy of its weight, made on the first forward of 2+ rows and again
whenever the weight is written in place (its version moves) or replaced: the cost is the layers' weights
once more in memory, dropped while the engine sleeps. Forwards that record gradients take ``F.linear`` on the weight itself. LoRA's own
``A`` and ``B`` stay plain (a few ranks wide; the routed adapters multiply them stacked).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# The row count oneDNN's layout is chosen for: packs for 4, 8 and 32 rows ran every row count from 2 to
# 128 within noise of each other here (a timing script, not committed; docs/benchmarks.md).
_PACKED_FOR_ROWS = 4


class PackedLinear(torch.nn.Linear):
    """An ``nn.Linear`` whose gradient-free forwards of two or more rows run on its packed weight."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if x.numel() < 2 * self.in_features or (torch.is_grad_enabled() and (w.requires_grad or x.requires_grad)):
            return F.linear(x, w, self.bias)
        key = (w.data_ptr(), w._version)
        if self.__dict__.get("_toolrl_packed_key") != key:
            packed = torch.ops.mkldnn._reorder_linear_weight(w.detach(), _PACKED_FOR_ROWS)
            self.__dict__.update(_toolrl_packed=packed, _toolrl_packed_key=key)
        return torch.ops.mkldnn._linear_pointwise(x, self.__dict__["_toolrl_packed"], self.bias, "none", [], "")


def pack_linears(model: torch.nn.Module) -> int:
    """Make every plain ``nn.Linear`` of ``model`` but LoRA's ``A`` and ``B`` a :class:`PackedLinear` (the
    same parameters; nothing is packed until a forward needs it); returns how many are packed now. Raises
    ValueError where torch has no oneDNN."""
    if not torch.backends.mkldnn.is_available():
        raise ValueError("packed_linears: true needs torch built with oneDNN (torch.backends.mkldnn.is_available() "
                         "is False here)")
    lora = {id(m) for layer in model.modules() if isinstance(getattr(layer, "lora_A", None), torch.nn.ModuleDict)
            for m in (*layer.lora_A.values(), *layer.lora_B.values())}
    for m in model.modules():
        if type(m) is torch.nn.Linear and id(m) not in lora:
            m.__class__ = PackedLinear
    return sum(type(m) is PackedLinear for m in model.modules())


def drop_packed(model: torch.nn.Module) -> None:
    """Free ``model``'s packed copies (a sleeping engine's memory); the next forward of 2+ rows packs again."""
    for m in model.modules():
        if type(m) is PackedLinear:
            m.__dict__.pop("_toolrl_packed", None)
            m.__dict__.pop("_toolrl_packed_key", None)
