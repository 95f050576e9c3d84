"""The tensor pieces of the transformers engine's decode loop (:mod:`toolrl.engines.transformers`), apart
from its class so that resolving the class imports no torch: inverse-CDF sampling over a large vocabulary,
and a KV layer that grows in place."""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import DynamicLayer

_CDF_BLOCK = 1024
# Uniforms a sampled row draws from its generator at once: block draws continue the generator's stream
# exactly as one draw per token would (CPU generators), at one call per block instead of one per token.
UNIFORM_BLOCK = 64


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Per row, the index ``i`` with ``cdf[i-1] < (1 - u) * total <= cdf[i]``: a draw from the
    (unnormalised) ``probs`` [rows, vocab] given uniforms ``u`` [rows] in [0, 1).

    Two levels (block sums, then one block) instead of a full cumulative sum over the vocabulary,
    which costs several times more on CPU. Sums within a block are float32 (1024 terms), across
    blocks float64, so nothing drifts over a 150k-entry vocabulary.
    ``1 - u`` is in (0, 1], so a zero-probability entry is never returned.
    """
    rows, vocab = probs.shape
    full = vocab // _CDF_BLOCK * _CDF_BLOCK
    sums = [probs[:, :full].reshape(rows, -1, _CDF_BLOCK).sum(-1)]
    if full < vocab:
        sums.append(probs[:, full:].sum(-1, keepdim=True))
    cum = torch.cat(sums, 1).cumsum(-1, dtype=torch.float64)
    target = (1.0 - u) * cum[:, -1]
    block = torch.searchsorted(cum, target[:, None]).clamp_(max=cum.shape[1] - 1)[:, 0]
    before = torch.where(block > 0, cum.gather(1, (block - 1).clamp(min=0)[:, None])[:, 0], 0.0)
    offsets = torch.arange(_CDF_BLOCK, device=probs.device)
    index = block[:, None] * _CDF_BLOCK + offsets
    inside = index < vocab
    vals = probs.gather(1, index.clamp(max=vocab - 1)) * inside
    within = vals.cumsum(-1, dtype=torch.float64)
    k = torch.searchsorted(within, (target - before)[:, None]).clamp_(max=_CDF_BLOCK - 1)
    # Rounding can put k on a zero entry at the block's edge: move to the nearest nonzero one. On a CPU
    # only when a row needs it (the check is free there); on a GPU for every row (checking would wait for it).
    nonzero = vals > 0
    ok = nonzero.gather(1, k)
    if probs.is_cuda or not bool(ok.all()):
        last_before = torch.where(nonzero & (offsets <= k), offsets, -1).max(-1, keepdim=True).values
        first_after = torch.where(nonzero & (offsets > k), offsets, _CDF_BLOCK).min(-1, keepdim=True).values
        k = torch.where(ok, k, torch.where(last_before >= 0, last_before, first_after))
    return block * _CDF_BLOCK + k[:, 0]


class BufferLayer(DynamicLayer):
    """One layer's KV for the whole batch in a preallocated buffer; ``update`` writes in place, so a
    decode step costs no copy of the cache (DynamicLayer concatenates on every step)."""

    def __init__(self, keys: torch.Tensor | None, values: torch.Tensor | None, length: int, capacity: int):
        super().__init__()
        self.kbuf, self.vbuf, self.length, self.capacity = keys, values, length, capacity
        self.is_initialized = keys is not None
        if keys is not None:
            self.dtype, self.device = keys.dtype, keys.device
            self.keys, self.values = keys[:, :, :length], values[:, :, :length]

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        b, h, _, d = key_states.shape
        self.kbuf = key_states.new_zeros(b, h, self.capacity, d)
        self.vbuf = value_states.new_zeros(b, h, self.capacity, value_states.shape[-1])
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        self.kbuf[:, :, self.length:end] = key_states
        self.vbuf[:, :, self.length:end] = value_states
        self.length = end
        self.keys, self.values = self.kbuf[:, :, :end], self.vbuf[:, :, :end]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length
