"""Additive attention masks handed to a model as prepared 4-D masks, one per layer type: what the
engine and the trainer give models whose sliding-window layers see only the ``sliding_window``
positions before each token; :func:`visible`, the one rule of which token sees which."""

from __future__ import annotations

from typing import Any

import torch


def sliding_window(config: Any) -> tuple[int | None, bool]:
    """The window the model's layers keep (None: none does) and whether it takes one mask per layer
    type (a model with ``layer_types``) or a single one (Mistral: every layer windowed)."""
    text = config.get_text_config()
    layer_types = getattr(text, "layer_types", None) or ()
    window = getattr(text, "sliding_window", None)
    return (window if "sliding_attention" in layer_types or not layer_types else None), bool(layer_types)


def visible(query_pos: torch.Tensor, key_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """The one rule of which token sees which, by positions in their sequence: a key at or before the
    query and, under a sliding ``window``, key position > query position - window (transformers')."""
    seen = key_pos <= query_pos
    return seen if window is None else seen & (key_pos > query_pos - window)


def by_layer_type(allowed: torch.Tensor, query_pos: torch.Tensor, key_pos: torch.Tensor, config: Any,
                  dtype: torch.dtype) -> torch.Tensor | dict[str, torch.Tensor]:
    """``allowed`` (bool, [..., q, k]: causal by position) as additive masks, the sliding layers' also
    within the window; ``query_pos`` [..., q, 1] and ``key_pos`` [..., 1, k] broadcast against it. A
    query that sees nothing (padding) sees everything instead: no key at all would give NaN."""
    window, by_type = sliding_window(config)
    masks = {"full_attention": allowed}
    if window is not None:
        masks["sliding_attention"] = allowed & visible(query_pos, key_pos, window)
    additive = {}
    for name, m in masks.items():
        m = m | ~m.any(-1, keepdim=True)
        additive[name] = torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill_(~m, torch.finfo(dtype).min)
    return additive if by_type else additive.get("sliding_attention", additive["full_attention"])
