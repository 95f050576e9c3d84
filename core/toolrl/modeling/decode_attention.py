"""The attention an engine's model runs (``toolrl_decode_sdpa`` in :mod:`toolrl.modeling.attention`):
transformers' sdpa, except a decode step's one query per row.

With a mask, transformers' sdpa copies every key/value head to each of its query heads before the call
(``repeat_kv``: grouped-query attention with a mask falls back to the math kernel otherwise): on an H200
those copies were 44% of the GPU's decode time at batch 64 (run 7, docs/gpu_runs). A step with one
query a row needs no copy: each key/value head's query heads become its queries, and the row's mask is
the same for all of them (on a GPU; on CPU transformers' own path stays). The trainer's attention
(:func:`toolrl.modeling.packed_attention.varlen_sdpa`) falls back to this one, so a module the trainer
and an engine share decodes the same way after the trainer installs its own.
"""

from __future__ import annotations

from typing import Any

import torch


def one_query_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                        scaling: float | None) -> torch.Tensor:
    """One query [rows, heads, 1, dim] per row over keys and values [rows, kv_heads, S, dim] under ``mask``
    [rows, 1, 1, S] (or None), as [rows, 1, heads, dim]; query head i reads key/value head i // groups."""
    rows, heads, _, dim = query.shape
    out = torch.nn.functional.scaled_dot_product_attention(
        query.view(rows, key.shape[1], heads // key.shape[1], dim), key, value, attn_mask=mask, scale=scaling)
    return out.reshape(rows, 1, heads, dim)


def sdpa(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
         attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' sdpa, with :func:`one_query_attention` for one query a row under grouped heads."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    one_mask = attention_mask is None or (attention_mask.dim() == 4 and attention_mask.shape[1] == 1)
    # Not on CPU: the copy costs little there, and the reordered sums would move every CPU figure's last
    # bits (sampled tokens, then whole learning curves) for no gain.
    if (query.device.type != "cpu" and query.shape[2] == 1 and key.shape[1] < query.shape[1] and one_mask
            and not kwargs.get("dropout")):
        return one_query_attention(query, key, value, attention_mask, kwargs.get("scaling")), None
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
