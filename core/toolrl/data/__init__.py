"""Datasets in verl's format: JSONL or parquet rows with ``prompt`` messages,
``reward_model.ground_truth``, ``extra_info.tools_kwargs``, ``data_source`` and optionally
``extra_info.env`` (the environment the row belongs to in a mixture)."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from pydantic import PrivateAttr, ValidationError

from toolrl import images
from toolrl.config import (
    Config,
    ConfigError,
    check_prompt_chars,
    format_errors,
    one_line,
    read_text,
    resolve_path,
)
from toolrl.images import IMAGE_PLACEHOLDER, is_image_part
from toolrl.parsers.bounded_json import JSONLimitError
from toolrl.parsers.bounded_json import loads as bounded_loads
from toolrl.schemas import Sample

# Dataset rows nest a few levels (messages, multimodal parts); anything near the stdlib decoder's
# recursion limit is a broken file. Integers up to Python's own int-string limit are data.
ROW_MAX_DEPTH = 100
ROW_MAX_NUMBER_CHARS = 4300


class FileSample(Sample):
    """A sample that remembers where it was read (``file:line`` or ``file row N``) for error messages."""

    _origin: str = PrivateAttr(default="")

    @property
    def origin(self) -> str:
        return self._origin


def origin_of(sample: Sample, fallback: str) -> str:
    """Where ``sample`` was read (``file:line``) for an error message; ``fallback`` for a sample that
    no file holds (generated splits)."""
    return (sample.origin if isinstance(sample, FileSample) else "") or fallback


def read_rows(path: Path) -> Iterator[tuple[str, Any]]:
    """``(origin, row)`` for each row: ``file:line`` (1-based, blank lines skipped) for JSONL,
    ``file row N`` (1-based) for parquet."""
    if path.suffix in (".jsonl", ".json"):
        # Split on newlines only: str.splitlines() also splits on U+2028 etc., which JSON strings may hold.
        for n, line in enumerate(read_text(path).split("\n"), 1):
            if not line.strip():
                continue
            try:
                row = bounded_loads(line, ROW_MAX_DEPTH, ROW_MAX_NUMBER_CHARS)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{path}:{n}: invalid JSON: {exc.msg} (column {exc.colno})") from None
            except JSONLimitError as exc:
                raise ConfigError(f"{path}:{n}: invalid JSON: {exc}") from None
            yield f"{path}:{n}", row
        return
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise ConfigError(f"{path}: not a readable parquet file: {one_line(str(exc))}") from None
        for n, row in enumerate(table.to_pylist(), 1):
            yield f"{path} row {n}", row
        return
    raise ConfigError(f"{path}: unsupported data file (use .jsonl or .parquet)")


def to_sample(row: Any, origin: str, base_dir: Path | None = None) -> FileSample:
    """One data row as a sample that remembers ``origin``; anything else is a one-line ConfigError.
    ``base_dir``: where relative image paths start (the data file's directory)."""
    if not isinstance(row, dict):
        raise ConfigError(f"{origin}: a row must be a JSON object, got {type(row).__name__}")
    row = with_images(row, origin, base_dir)
    try:
        sample = FileSample.model_validate(row)
    except ValidationError as exc:
        raise ConfigError(f"{origin}: {format_errors(exc)}") from None
    if not sample.prompt:
        raise ConfigError(f"{origin}: prompt: no messages (a row needs at least one)")
    for m, message in enumerate(sample.prompt):  # a part the templates and engines cannot show is not dropped
        for n, part in enumerate(message.content if isinstance(message.content, list) else []):
            if part.get("type") != "text" and not is_image_part(part):
                raise ConfigError(f"{origin}: prompt.{m}.content.{n}: a {part.get('type')!r} part; a prompt "
                                  "holds text and image parts")
    try:
        check_prompt_chars(row.get("prompt"))
    except ValueError as exc:
        raise ConfigError(f"{origin}: prompt: {exc}") from None
    sample._origin = origin
    return sample


def with_images(row: dict[str, Any], origin: str, base_dir: Path | None) -> dict[str, Any]:
    """``row`` with its images PNG-encoded within the default limits (toolrl.images) under ``images``, in
    prompt order: the ``images`` column fills the ``<image>`` placeholders of the messages' text and
    their bare image parts (verl's layout); an image part that carries its image (OpenAI/Hugging Face
    layout: a path, base64, a data URL, bytes) gives it and becomes a bare part."""
    column = row.get("images")
    prompt = row.get("prompt")
    if not column and not _has_inline_images(prompt):
        return {k: v for k, v in row.items() if k != "images"}
    if column is not None and not isinstance(column, list):
        raise ConfigError(f"{origin}: images: must be a list, got {type(column).__name__}")
    column = list(column or [])
    limits, found = images.ImageLimits(), []
    messages = [dict(m) if isinstance(m, dict) else m for m in prompt] if isinstance(prompt, list) else prompt
    for m_i, message in enumerate(messages if isinstance(messages, list) else []):
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            found += [None] * content.count(IMAGE_PLACEHOLDER)
            continue
        if not isinstance(content, list):
            continue
        parts = []
        for p_i, part in enumerate(content):
            if images.is_image_part(part):
                value = images.part_image(part)
                found.append(None if value is None else (f"prompt.{m_i}.content.{p_i}", value))
                part = {"type": "image"}
            parts.append(part)
        message["content"] = parts
    slots = found.count(None)  # the placeholders and bare parts, which the column fills in order
    if slots != len(column):
        raise ConfigError(f"{origin}: images: {len(column)} images for {slots} image placeholders "
                          f"({IMAGE_PLACEHOLDER} or bare image parts) in the prompt")
    if len(found) > limits.max_per_sample:
        raise ConfigError(f"{origin}: images: {len(found)} images, over the limit of {limits.max_per_sample}")
    from_column = ((f"images.{n}", value) for n, value in enumerate(column))
    encoded = []
    for field, value in (item or next(from_column) for item in found):
        try:
            encoded.append(images.prepare(value, limits, base_dir))
        except images.ImageError as exc:
            raise ConfigError(f"{origin}: {field}: {exc}") from None
    return {**row, "prompt": messages, "images": encoded}


def _has_inline_images(prompt: Any) -> bool:
    return isinstance(prompt, list) and any(
        isinstance(m, dict) and isinstance(m.get("content"), list) and any(map(is_image_part, m["content"]))
        for m in prompt)


def existing(path: Path, field: str) -> Path:
    """``path``, or the one-line error naming the config key ``field`` it came from."""
    if not path.exists():
        raise ConfigError(f"{field}: {path} does not exist")
    return path


def check_data_files(config: Config, fields: Sequence[str]) -> None:
    """Every file of the ``data`` keys ``fields`` (those the run reads) exists: checked first, before a
    part or a model loads."""
    for field in fields:
        for name in getattr(config.data, field):
            existing(resolve_path(config, name), f"data.{field}")


def load_files(paths: list[Path], field: str = "data.train_files") -> list[Sample]:
    """Every row of ``paths``; ``field`` names the config key they came from in errors."""
    samples: list[Sample] = []
    for path in paths:
        for origin, row in read_rows(existing(path, field)):
            sample = to_sample(row, origin, path.parent)
            if sample.index is None:
                sample.index = len(samples)
            samples.append(sample)
    if not samples:
        raise ConfigError(f"{field}: no rows in {', '.join(map(str, paths))}")
    return samples


def write_samples(samples: list[Sample], path: Path) -> None:
    """Write samples back in verl's row layout."""
    with path.open("w") as f:
        for s in samples:
            row = {
                "data_source": s.data_source,
                "prompt": [m.to_template() for m in s.prompt],
                "reward_model": {"style": "rule", "ground_truth": s.ground_truth},
                "extra_info": {**s.extra_info, "index": s.index,
                               **({"level": s.level} if s.level is not None else {}),
                               "tools_kwargs": {k: v.model_dump() for k, v in s.tools_kwargs.items()}},
            }
            if s.images:  # base64, in the order the prompt refers to them (read back by with_images)
                row["images"] = [base64.b64encode(png).decode() for png in s.images]
            f.write(json.dumps(row) + "\n")
