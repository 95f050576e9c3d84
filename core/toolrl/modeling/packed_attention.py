"""The trainer's attention over a packed row (:mod:`toolrl.training.packing`; ``toolrl_varlen_sdpa`` in
:mod:`toolrl.modeling.attention`): sdpa itself for every ordinary call, and given the row's sequence
edges (``cu_seq_lens``) one causal sdpa per span (:func:`varlen_sdpa`), or one attention call per layer
for the whole row, spans and prefix trees included (:func:`attend`); under sequence parallelism the
same for a rank's heads, between its group's all-to-alls (:func:`ulysses_sdpa`, ``toolrl_ulysses_sdpa``).

A row's pattern is built once per batch (:class:`RowPattern`): each row position's span and its
position in its sequence, and which spans see which (a tree span sees its ancestors' rows). A query
sees a key of its own span or of a span it sees, by their positions (:func:`toolrl.masks.visible`: at
or before it, within a sliding window). That rule is FlexAttention's ``mask_mod`` on CUDA (a
``BlockMask`` per window, made once per batch, and the compiled kernel), a dense boolean mask for one
sdpa call (FlexAttention has no backward on CPU) and the eager row mask (``packing.row_masks``, which
gpt-oss runs for its attention sinks, not here).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import torch

from toolrl.masks import visible
from toolrl.modeling import decode_attention

# The keyword that carries a tree batch's per-span attention through the model to varlen_sdpa.
TREE_KWARG = "toolrl_tree"
# The keyword that carries a row's attention pattern (one call per layer) to varlen_sdpa.
PATTERN_KWARG = "toolrl_pattern"
# The keyword that carries a rank's sequence-parallel group to ulysses_sdpa: its ``size`` N and its two
# all-to-alls (toolrl.training.sequence_parallel.SequenceParallel).
SP_KWARG = "toolrl_sp"


@dataclass
class RowPattern:
    """Who sees whom in a packed row of ``T`` positions cut into ``S`` spans."""

    span: torch.Tensor  # [T] the span of each row position
    position: torch.Tensor  # [T] its position in its sequence
    sees: torch.Tensor  # [S, S] bool: span a sees all rows of span b (b an ancestor of a)
    _masks: dict[tuple[str, int | None], Any] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, bounds: list[int], tree: list[torch.Tensor | None] | None, device: torch.device) -> RowPattern:
        """The pattern of spans cut at ``bounds``; ``tree`` (per span None or the rows it attends to: its
        context, whole ancestor spans, then itself) as ``PackedBatch.attention``."""
        sizes = torch.tensor([b - a for a, b in zip(bounds, bounds[1:], strict=False)], device=device)
        count = len(sizes)
        span = torch.repeat_interleave(torch.arange(count, device=device), sizes)
        starts = torch.tensor(bounds[:-1], device=device)
        context = torch.zeros(count, dtype=torch.long, device=device)
        sees = torch.zeros(count, count, dtype=torch.bool, device=device)
        if tree is not None:
            owners, rows = [], []
            for s, keys in enumerate(tree):
                if keys is not None:
                    n = keys.numel() - (bounds[s + 1] - bounds[s])
                    owners.append(torch.full((n,), s, device=device))
                    rows.append(keys[:n].to(device))
                    context[s] = n
            if owners:
                sees[torch.cat(owners), span[torch.cat(rows)]] = True
        position = torch.arange(span.numel(), device=device) - starts[span] + context[span]
        return cls(span, position, sees)

    def mask_mod(self, window: int | None) -> Any:
        """FlexAttention's rule for whether query ``q`` sees key ``k`` (batch and head ignored)."""
        span, position, sees = self.span, self.position, self.sees

        def allowed(b: Any, h: Any, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
            return ((span[q] == span[k]) | sees[span[q], span[k]]) & visible(position[q], position[k], window)

        return allowed

    def dense(self, window: int | None) -> torch.Tensor:
        """The rule as a boolean [T, T] mask (made once per window)."""
        if ("dense", window) not in self._masks:
            idx = torch.arange(self.span.numel(), device=self.span.device)
            self._masks["dense", window] = self.mask_mod(window)(None, None, idx[:, None], idx[None, :])
        return self._masks["dense", window]

    def block_mask(self, window: int | None) -> Any:
        """The rule as FlexAttention's BlockMask (made once per window), built from the rule's values
        over a few query blocks at a time. ``create_block_mask`` evaluates ``mask_mod`` through vmap, one
        indexing op per (query, key) pair: 250 ms of host time a step at 16k tokens on an H200 (run 7)."""
        from torch.nn.attention.flex_attention import _DEFAULT_SPARSE_BLOCK_SIZE as B
        from torch.nn.attention.flex_attention import BlockMask

        if ("block", window) not in self._masks:
            t = self.span.numel()
            n = -(-t // B)
            keys = torch.arange(n * B, device=self.span.device).clamp_(max=t - 1)
            rule = self.mask_mod(window)
            counts = torch.empty(n, n, dtype=torch.int32, device=self.span.device)
            chunk = max(1, (1 << 26) // (B * n * B))  # query blocks per pass: at most 64M (query, key) pairs
            for first in range(0, n, chunk):
                queries = keys[first * B:(first + chunk) * B]
                seen = rule(None, None, queries[:, None], keys[None, :])
                # Padding past the row's end sees nothing, as create_block_mask pads with False.
                seen &= (torch.arange(first * B, first * B + len(queries), device=keys.device) < t)[:, None]
                seen[:, t:] = False
                counts[first:first + chunk] = seen.view(-1, B, n, B).sum((1, 3), dtype=torch.int32)
            full = counts == B * B
            partial = (counts > 0) & ~full

            def ordered(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
                order = torch.argsort(blocks.to(torch.int32), dim=-1, descending=True, stable=True)
                return blocks.sum(-1, dtype=torch.int32)[None, None], order.to(torch.int32)[None, None]

            self._masks["block", window] = BlockMask.from_kv_blocks(
                *ordered(partial), *ordered(full), BLOCK_SIZE=B, mask_mod=rule, seq_lengths=(t, t))
        return self._masks["block", window]


@functools.cache
def _compiled_flex() -> Any:
    # Compiled once; dynamic: every packed row has its own length.
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=True)


def attend(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, pattern: RowPattern,
           window: int | None, scaling: float | None, flex: bool) -> torch.Tensor:
    """Attention of the row's queries [1, heads, T, dim] over its keys and values [1, kv_heads, T, dim]
    under ``pattern``, as [1, T, heads, dim]: FlexAttention (``flex``; compiled on CUDA) or one sdpa
    call with the dense mask."""
    if flex:
        from torch.nn.attention.flex_attention import flex_attention

        flex_fn = _compiled_flex() if query.is_cuda else flex_attention
        out = flex_fn(query, key, value, block_mask=pattern.block_mask(window), scale=scaling,
                  enable_gqa=key.shape[1] != query.shape[1])
    else:
        from transformers.integrations.sdpa_attention import repeat_kv

        groups = getattr(module, "num_key_value_groups", 1)
        out = torch.nn.functional.scaled_dot_product_attention(
            query, repeat_kv(key, groups), repeat_kv(value, groups), attn_mask=pattern.dense(window)[None, None],
            scale=scaling)
    return out.transpose(1, 2).contiguous()


def varlen_sdpa(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, *, cu_seq_lens_q: torch.Tensor | None = None,
                toolrl_tree: list[torch.Tensor | None] | None = None, toolrl_pattern: Any = None,
                **kwargs: Any) -> tuple[torch.Tensor, None]:
    if cu_seq_lens_q is None or query.shape[0] != 1:
        return decode_attention.sdpa(module, query, key, value, attention_mask, **kwargs)
    # A packed row: ``attention_mask`` is the model's causal (or sliding-window) mask over the whole row,
    # blind to where sequences start; each span's is built here instead.
    for k in ("cu_seq_lens_k", "max_length_q", "max_length_k", "is_causal"):
        kwargs.pop(k, None)
    window = kwargs.pop("sliding_window", None)
    if toolrl_pattern is not None:
        if kwargs.get("dropout", 0.0):
            raise ValueError("one-call packed attention takes no attention dropout")
        return attend(module, query, key, value, toolrl_pattern, window, kwargs.get("scaling"), query.is_cuda), None
    bounds = cu_seq_lens_q.tolist()
    outs = []
    for s, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False)):
        # A tree's span sees its context (its ancestors' rows), then itself; any other span itself only.
        rows = toolrl_tree[s] if toolrl_tree is not None and toolrl_tree[s] is not None else slice(a, b)
        outs.append(_span_attention(module, query[:, :, a:b], key[:, :, rows], value[:, :, rows], window, kwargs))
    return torch.cat(outs, dim=1), None


def _span_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, window: int | None,
                    kwargs: dict[str, Any]) -> torch.Tensor:
    """Attention of a span's n queries over ``key``: the sequence's positions from 0, the span's own
    last. Query i (position c + i, c the context's length) sees key j by :func:`toolrl.masks.visible`:
    its kernels (sdpa causal, lower-right causal) where the window hides no key, its band where it does."""
    from torch.nn.attention.bias import causal_lower_right
    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

    n, context = query.shape[2], key.shape[2] - query.shape[2]
    if window is not None:
        drop = max(0, context - window + 1)  # keys out of every query's window
        key, value, context = key[:, :, drop:], value[:, :, drop:], context - drop
        if window < context + n:
            q = torch.arange(context, context + n, device=query.device)[:, None]
            band = visible(q, torch.arange(context + n, device=query.device)[None], window)
            return sdpa_attention_forward(module, query, key, value, band[None, None], is_causal=False, **kwargs)[0]
    if context == 0:
        return sdpa_attention_forward(module, query, key, value, None, is_causal=True, **kwargs)[0]
    groups = getattr(module, "num_key_value_groups", 1)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, repeat_kv(key, groups), repeat_kv(value, groups), attn_mask=causal_lower_right(n, context + n),
        dropout_p=kwargs.get("dropout", 0.0), scale=kwargs.get("scaling"))
    return out.transpose(1, 2).contiguous()


class _HeadGroups:
    """``module`` as attention sees it after key/value heads were repeated: one query head per key
    head (``num_key_value_groups`` 1), everything else the module's own."""

    def __init__(self, module: Any, groups: int) -> None:
        self._module = module
        self.num_key_value_groups = groups

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


def ulysses_sdpa(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: torch.Tensor | None, *, toolrl_sp: Any = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """:func:`varlen_sdpa` for this rank's H/N heads over the whole row, between its group's two all-to-alls
    (DeepSpeed-Ulysses: each rank holds an N-th of the row's tokens); without a group, that function itself."""
    if toolrl_sp is None:
        return varlen_sdpa(module, query, key, value, attention_mask, **kwargs)
    n, heads, kv_heads = toolrl_sp.size, query.shape[1], key.shape[1]
    groups = heads // kv_heads
    if kv_heads % n:  # too few key/value heads to split: each query head gets its own copy
        key, value = (x.repeat_interleave(groups, dim=1) for x in (key, value))
        groups = 1
    q, k, v = (toolrl_sp.to_heads(x) for x in (query, key, value))
    out, _ = varlen_sdpa(_HeadGroups(module, groups), q, k, v, None, **kwargs)
    return toolrl_sp.to_tokens(out), None
