"""Trainer weights to a safetensors checkpoint directory that vLLM's loader reads in place.

The engine runs in other processes, so weights travel through a file: one ``model.safetensors``
written atomically (temporary name, then rename) into a directory the engine owns. Tensors that share
storage (tied embeddings: ``lm_head.weight`` is ``model.embed_tokens.weight``) are written once, under
the first name, which is how Hugging Face checkpoints of tied models look and what vLLM expects.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

WEIGHTS_FILE = "model.safetensors"


def unique_tensors(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    """Detached, contiguous CPU copies of the tensors, each storage once (first name wins)."""
    import torch

    seen: set[tuple[int, int, tuple[int, ...], tuple[int, ...]]] = set()
    out: dict[str, Any] = {}
    for name, value in state_dict.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"update_weights: {name!r} is a {type(value).__name__}, not a tensor")
        key = (value.untyped_storage().data_ptr(), value.storage_offset(), tuple(value.shape), tuple(value.stride()))
        if key in seen:
            continue
        seen.add(key)
        out[name] = value.detach().to("cpu", copy=True).contiguous()
    return out


def write_checkpoint(state_dict: Mapping[str, Any], directory: Path) -> Path:
    """Write ``state_dict`` to ``directory/model.safetensors``; returns the file."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    final = directory / WEIGHTS_FILE
    tmp = directory / f".{WEIGHTS_FILE}.tmp"
    save_file(unique_tensors(state_dict), str(tmp), metadata={"format": "pt"})
    os.replace(tmp, final)
    return final
