"""The tensor pieces of the transformers engine's decode loop (:mod:`toolrl.engines.transformers`), apart
from its class so that resolving the class imports no torch: sampling each row's token (inverse CDF over a
large vocabulary), and a KV layer that grows in place."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from transformers.cache_utils import DynamicLayer

if TYPE_CHECKING:
    from toolrl.engines.transformers.scheduler import Row

_CDF_BLOCK = 1024


def sample(rows: list[Row], logits: torch.Tensor) -> tuple[list[int], list[float]]:
    """One token per row and its logprob. Greedy rows take the argmax (logprob from the raw logits);
    sampled rows draw from softmax(logits / T), restricted to the top-p nucleus, by inverting the CDF at
    one uniform from their own generator (all rows' reach the device in one copy). The logprob is that
    of softmax(logits / T), before top-p."""
    temps = [r.req.params.temperature for r in rows]
    if any(t not in (0, 1) for t in temps):
        logits = logits / torch.tensor([t or 1.0 for t in temps], device=logits.device)[:, None]
    probs = torch.softmax(logits, dim=-1)
    sampled = [i for i, t in enumerate(temps) if t != 0]
    # argmax over the vocabulary is not free on CPU: only greedy rows need it.
    chosen = logits.argmax(-1) if len(sampled) < len(rows) else logits.new_zeros(len(rows), dtype=torch.long)
    if sampled:
        p = probs if len(sampled) == len(rows) else probs[sampled]
        nucleus = [k for k, i in enumerate(sampled) if rows[i].req.params.top_p < 1.0]
        if nucleus:
            top_p = torch.tensor([rows[sampled[k]].req.params.top_p for k in nucleus], device=p.device)
            sorted_p, order = p[nucleus].sort(dim=-1, descending=True)
            # Keep the smallest prefix whose mass reaches top_p (always at least the top token).
            outside = (sorted_p.cumsum(-1) - sorted_p) >= top_p[:, None]
            p = p.clone() if p is probs else p  # the logprobs are taken before top-p
            p[nucleus] = torch.zeros_like(sorted_p).scatter(-1, order, sorted_p.masked_fill(outside, 0.0))
        u = torch.tensor([rows[i].uniform() for i in sampled], dtype=torch.float64, device=p.device)
        chosen[torch.tensor(sampled, device=p.device)] = inverse_cdf(p, u)
    logprobs = probs.gather(1, chosen[:, None])[:, 0].log()
    # One copy to the host for both (token ids are exact in float64).
    ids, lps = torch.stack((chosen.to(torch.float64), logprobs.to(torch.float64))).tolist()
    return [int(i) for i in ids], lps


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
