"""Images in samples and tool results, in one place: decode whatever form an image arrives in
(encoded bytes, Hugging Face's ``{"bytes", "path"}`` feature, a PIL image, a ``data:`` URL, base64
text, a file path), check it, size it to the configured limits and PNG-encode it.

The size check reads the image's header before decoding its pixels, so a decompression bomb is
refused without being decoded. Images larger than ``max_pixels`` are resized down (aspect kept), as
Qwen's ``max_pixels`` does; images above ``hard_max_pixels`` are refused.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

IMAGE_PLACEHOLDER = "<image>"  # where a row's ``images`` column goes in its text (verl's layout)
# Message parts that carry an image in the OpenAI/Hugging Face chat layout.
IMAGE_PART_TYPES = ("image", "image_url", "input_image")


class ImageError(ValueError):
    """An image that cannot be used; the message says why in one line."""


class ImageLimits(BaseModel):
    """What an image may be (``rollout.images`` in the config)."""

    model_config = ConfigDict(extra="forbid")

    max_pixels: int = Field(1_003_520, gt=0, description="larger images are resized down to this (aspect kept)")
    hard_max_pixels: int = Field(50_000_000, gt=0, description="larger images are refused")
    max_per_sample: int = Field(16, ge=0, description="images in one sample's prompt")
    max_per_trajectory: int = Field(32, ge=0, description="images in one trajectory (prompt and tool results)")


def _encoded(value: Any, base_dir: Path | None) -> bytes:
    """The encoded image bytes behind ``value``."""
    if isinstance(value, dict):  # {"bytes": ..., "path": ...}, {"url": ...} or {"image": ...}
        for key in ("bytes", "image", "url", "path"):
            if value.get(key) is not None:
                return _encoded(value[key], base_dir)
        raise ImageError("an image object with none of bytes, image, url, path")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        if value.startswith("data:"):
            header, _, payload = value.partition(",")
            if ";base64" not in header:
                raise ImageError("a data: URL that is not base64")
            return _b64(payload)
        path = Path(value).expanduser() if len(value) <= 4096 else None
        path = path if path is None or path.is_absolute() or base_dir is None else base_dir / path
        # Base64 has no ".": text without one that names no file is base64 data.
        if path is None or ("." not in value and not _is_file(path)):
            return _b64(value)
        try:
            return path.read_bytes()
        except OSError as exc:
            raise ImageError(f"cannot read {path}: {exc.strerror or exc}") from None
    raise ImageError(f"unsupported image value of type {type(value).__name__}")


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:  # a name too long for a file: data
        return False


def _b64(text: str) -> bytes:
    text = "".join(text.split())
    try:  # standard or URL-safe (pydantic's JSON bytes) alphabet
        return base64.b64decode(text, altchars=b"-_" if "-" in text or "_" in text else None, validate=True)
    except (binascii.Error, ValueError):
        raise ImageError("neither a file path nor valid base64") from None


def load(value: Any, limits: ImageLimits, base_dir: str | os.PathLike[str] | None = None) -> Any:
    """``value`` as an RGB PIL image within ``limits``; :class:`ImageError` otherwise."""
    from PIL import Image

    if isinstance(value, Image.Image):
        image = value
    else:
        data = _encoded(value, Path(base_dir) if base_dir is not None else None)
        try:
            image = Image.open(io.BytesIO(data))
        except Image.DecompressionBombError:  # PIL's own cap, far above any limit toolrl allows
            raise ImageError(f"its size is over the limit of {limits.hard_max_pixels:,} pixels "
                             "(rollout.images.hard_max_pixels)") from None
        except Exception as exc:
            raise ImageError(f"does not decode as an image ({type(exc).__name__})") from None
    width, height = image.size
    if width <= 0 or height <= 0:
        raise ImageError(f"has no pixels ({width}x{height})")
    if width * height > limits.hard_max_pixels:
        raise ImageError(f"{width}x{height} is {width * height:,} pixels: over the limit of "
                         f"{limits.hard_max_pixels:,} pixels (rollout.images.hard_max_pixels)")
    try:
        image = image.convert("RGB")  # decodes the pixels: a truncated file fails here
    except Exception as exc:
        raise ImageError(f"does not decode as an image ({type(exc).__name__}: {exc})") from None
    if width * height > limits.max_pixels:
        scale = math.sqrt(limits.max_pixels / (width * height))
        size = (max(1, math.floor(width * scale)), max(1, math.floor(height * scale)))
        image = image.resize(size, Image.Resampling.BICUBIC)
    return image


def prepare(value: Any, limits: ImageLimits, base_dir: str | os.PathLike[str] | None = None) -> bytes:
    """``value`` decoded, checked, sized to ``limits`` and PNG-encoded: the form toolrl keeps images in."""
    buffer = io.BytesIO()
    load(value, limits, base_dir).save(buffer, format="PNG")
    return buffer.getvalue()


def from_png(png: bytes) -> Any:
    from PIL import Image

    return Image.open(io.BytesIO(png)).convert("RGB")


def is_image_part(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") in IMAGE_PART_TYPES


def part_image(part: dict[str, Any]) -> Any:
    """The image an image part carries (``image``, ``image_url.url`` or ``url``); None: a bare
    placeholder whose image comes from elsewhere (a row's ``images`` column)."""
    value = next((part[key] for key in ("image", "image_url", "url", "path") if part.get(key) is not None), None)
    return value.get("url") if isinstance(value, dict) and "url" in value else value


def images_held(images: Sequence[Any], ids: Sequence[int], image_token_id: int, merge: int) -> int:
    """How many of ``images`` (in token order, each with its ``grid_thw``) have their placeholder runs in
    ``ids``, a prefix of the tokens that hold them: an image's run is ``t*h*w / merge**2`` tokens. A
    prefix that ends inside a run is an error."""
    tokens = list(ids).count(image_token_id)
    for held, image in enumerate(images):
        placeholders = math.prod(image.grid_thw) // merge**2
        if tokens < placeholders:
            if tokens:
                raise ValueError("the tokens end inside an image's placeholder run")
            return held
        tokens -= placeholders
    return len(images)


def pixel_values(processor: Any, images: Sequence[Any], where: str) -> tuple[Any, Any]:
    """``pixel_values`` and ``image_grid_thw`` (torch tensors, as a Qwen2-VL forward takes them) of
    ``images`` (each with its ``png`` and the ``grid_thw`` the rollout recorded), through ``processor``'s
    image processor. A grid other than the recorded one means ``where`` (the engine, the trainer) and the
    rollout use different processors: a ValueError, since the image's tokens would not match its pixels."""
    out = processor.image_processor(images=[from_png(i.png) for i in images], return_tensors="pt")
    grids = [tuple(int(v) for v in grid) for grid in out["image_grid_thw"].tolist()]
    recorded = [tuple(i.grid_thw) for i in images]
    if grids != recorded:
        raise ValueError(f"{where}'s processor gives image grids {grids}, the rollout recorded {recorded}: "
                         "the two use different processors")
    return out["pixel_values"], out["image_grid_thw"]
