"""One attention call per layer over a packed row (:mod:`toolrl.training.packing`), spans and prefix
trees included, instead of one sdpa call per span.

A row's pattern is built once per batch (:class:`RowPattern`): each row position's span and its
position in its sequence, and which spans see which (a tree span sees its ancestors' rows). A query
sees a key of its own span or of a span it sees, by their positions (:func:`toolrl.masks.visible`: at
or before it, within a sliding window). That rule is FlexAttention's ``mask_mod`` on CUDA (a
``BlockMask`` per window, made once per batch, and the compiled kernel), a dense boolean mask for one
sdpa call (FlexAttention has no backward on CPU) and the eager row mask (``packing.row_masks``). Attention sinks (gpt-oss) are not here: gpt-oss runs
eager attention, whose one mask over the row already covers the tree (``packing.row_masks``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import torch

from toolrl.masks import visible


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
