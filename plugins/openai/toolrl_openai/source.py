"""Where the served model comes from: resolved exactly as training resolves ``model.source``."""

from __future__ import annotations

from typing import Any


def model_path(config: Any) -> str:
    """The model directory for ``config.model.source`` (tiny-qwen3, smollm2-135m-instruct or a path)."""
    from toolrl.compose import model_path as resolve

    return resolve(config)
