"""Prompts checked against the model's context before any model loads: each prompt is rendered with
the chat template (and the tools' schemas) only when a cheap bound says it might not fit, so a run
whose prompts all fit pays almost nothing, and one that does not fails once, naming the row."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from toolrl.config import ConfigError, text_size
from toolrl.data import origin_of
from toolrl.engines import context_overflow
from toolrl.images import ImageLimits
from toolrl.model_sources import model_config, text_config
from toolrl.renderers.chat import ChatRenderer
from toolrl.rollout.episode import prompt_of
from toolrl.schemas import Sample


def model_context(tokenizer: Any, model_dir: str | Path) -> tuple[int, str] | None:
    """The model's context in tokens, as the engines take it, and where it is stated:
    ``max_position_embeddings`` in its ``config.json`` (the text model's, for a multimodal one),
    or the tokenizer's ``model_max_length`` when that is smaller. None when neither says."""
    path = Path(model_dir) / "config.json"
    text = text_config(model_config(model_dir))
    stated = [(text.get("max_position_embeddings"), f"max_position_embeddings in {path}"),
              (getattr(tokenizer, "model_max_length", None), "the tokenizer's model_max_length")]
    # transformers' "unset" model_max_length is 1e30.
    known = [(n, where) for n, where in stated if isinstance(n, int) and not isinstance(n, bool) and 0 < n < 1 << 40]
    return min(known, key=lambda item: item[0]) if known else None


def check_prompt_tokens(samples: Sequence[Sample], tokenizer: Any, model_dir: str | Path, processor: Any,
                        source: str, limits: ImageLimits | None = None, cap: tuple[int, str] | None = None,
                        renderer_of: Callable[[Sample], ChatRenderer] | None = None) -> None:
    """Every prompt, rendered with the chat template (its images as ``processor`` expands them, within
    ``limits``; None: text only, as for the rollout), leaves room in the model's context for a response: otherwise each of its
    trajectories fails in the engine, after the model has loaded. ``cap``: a smaller context the run
    sets (``model.max_context``: its value and where it is set); ``renderer_of``: the renderer a
    sample's route renders it with (its template, the tools' schemas known before they are built;
    default: the tokenizer's template, no tools). Only prompts long enough to possibly not fit are
    rendered (a token covers at least one UTF-8 byte, an image at most :func:`image_token_bound`
    tokens, and the tools' schemas at least one token per message's worth of overhead), so short
    prompts cost nothing. ``source`` names samples that do not know their file."""
    found = model_context(tokenizer, model_dir)
    if cap is not None and (found is None or cap[0] < found[0]):
        found = cap
    if found is None:
        return
    context, stated = found
    limits = limits or ImageLimits()
    plain = ChatRenderer(tokenizer, processor=processor)
    per_image = image_token_bound(processor, limits) if processor is not None else 0
    overheads: dict[int, int] = {}
    for i, sample in enumerate(samples, 1):
        messages = [m.to_template() for m in sample.prompt]
        renderer = renderer_of(sample) if renderer_of is not None else plain
        if id(renderer) not in overheads:  # a message's template tokens, with the tools' block once
            overheads[id(renderer)] = len(renderer.prompt_ids([{"role": "user", "content": ""}]))
        bound = text_size(messages, _utf8_bytes) + overheads[id(renderer)] * len(messages)
        if bound + per_image * len(sample.images) < context:
            continue
        messages, images = prompt_of(renderer, sample, limits)
        tokens = len(renderer.prompt_ids(messages, [image.grid_thw for image in images]))
        if tokens >= context:
            origin = origin_of(sample, f"{source} sample {i}")
            shown = f", {len(images)} image{'s' * (len(images) != 1)} included" if images else ""
            tools = " and its tools' schemas" if renderer.tool_schemas else ""
            raise ConfigError(f"{origin}: {context_overflow(tokens, context, stated, ' with the chat template' + tools + shown)}")


def image_token_bound(processor: Any, limits: ImageLimits) -> int:
    """More tokens than any image within ``limits`` expands to: the processor resizes it into its pixel
    range (Qwen2-VL's ``min_pixels``/``max_pixels``, stored as ``size``'s shortest/longest edge) in
    multiples of its patch and merge size, up to one more row and column of merged patches."""
    images = processor.image_processor
    side = images.patch_size * images.merge_size
    low, high = (_pixel_setting(images, name, edge) for name, edge in
                 (("min_pixels", "shortest_edge"), ("max_pixels", "longest_edge")))
    pixels = max(min(limits.max_pixels, high or limits.max_pixels), low or 0)
    return int(pixels / side**2 + 2 * math.sqrt(pixels) / side + 1) + 1


def _pixel_setting(images: Any, name: str, edge: str) -> int | None:
    size = getattr(images, "size", None)
    found = getattr(images, name, None) or getattr(size, edge, None) or \
        (size.get(edge) if isinstance(size, dict) else None)
    return int(found) if found else None


def _utf8_bytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))
