"""Geometry3K-format rows (``problem``, ``answer``, ``images``) -> verl-format parquet with ``tools_kwargs``.

Input: a parquet or JSON-lines file, or a directory of them (the files whose name starts with the
split name, e.g. ``train-00000-of-00001.parquet``, or its only file). Images may be
encoded bytes, ``{"bytes": ..., "path": ...}`` dicts (Hugging Face's image feature), PIL images, file
paths (relative to the input file) or ``data:`` URLs.

Output: ``<output_dir>/<split>.parquet`` with verl's columns (``data_source``, ``prompt``, ``images``,
``ability``, ``reward_model``, ``extra_info``) plus ``agent_name: tool_agent`` (verl runs tools only
for samples that name a tool agent loop). The ground truth goes both to ``reward_model.ground_truth``
and to ``extra_info.tools_kwargs.calc_geo3k_reward.create_kwargs.ground_truth``, where the tool's
``create`` receives it.
"""

from __future__ import annotations

import base64
import io
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

DATA_SOURCE = "hiyouga/geometry3k"
TOOL_NAME = "calc_geo3k_reward"
IMAGE_TOKEN = "<image>"
SUFFIXES = (".parquet", ".jsonl", ".json")

SYSTEM_PROMPT = (
    "You are a careful geometry solver. Reason step by step. Before you give your final answer, check it "
    f"by calling the `{TOOL_NAME}` tool; if the reward it reports is 0, find your mistake and try again."
)
INSTRUCTION = (
    f'Solve the problem. Call `{TOOL_NAME}` with your answer (for example {{"answer": "3"}}) before '
    "answering, then put the final answer in \\boxed{}."
)


class Geo3kDataError(ValueError):
    """An input that cannot be converted; the message names the file and row."""


def input_files(path: str | os.PathLike, split: str) -> list[Path]:
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise Geo3kDataError(f"{path}: no such file or directory")
    candidates = sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(SUFFIXES))
    chosen = [p for p in candidates if p.name.startswith(split)]
    if chosen:
        return chosen
    if len(candidates) == 1:
        return candidates
    names = ", ".join(p.name for p in candidates) or f"no {', '.join(SUFFIXES)} files"
    raise Geo3kDataError(f"{path}: no file name starts with the split {split!r} ({names})")


def read_records(files: Iterable[Path]) -> Iterator[tuple[Path, int, dict[str, Any]]]:
    """(file, row number, row) for every row of every file."""
    for file in files:
        if file.name.endswith(".parquet"):
            import pyarrow.parquet as pq

            rows: Iterable[dict[str, Any]] = pq.read_table(file).to_pylist()
        else:
            with file.open(encoding="utf-8") as handle:
                try:
                    rows = [json.loads(line) for line in handle if line.strip()]
                except json.JSONDecodeError as exc:
                    raise Geo3kDataError(f"{file}: invalid JSON line: {exc}") from None
        for number, row in enumerate(rows):
            yield file, number, row


def image_bytes(value: Any, base_dir: Path) -> tuple[bytes, str | None]:
    """Encoded image bytes (checked to decode) and the image's file name if it has one."""
    from PIL import Image

    name: str | None = None
    if isinstance(value, dict):
        data, name = value.get("bytes"), value.get("path")
        value = data if data is not None else name
    if isinstance(value, Image.Image):
        buffer = io.BytesIO()
        value.save(buffer, format="PNG")
        data = buffer.getvalue()
    elif isinstance(value, (bytes, bytearray)):
        data = bytes(value)
    elif isinstance(value, str) and value.startswith("data:"):
        data = base64.b64decode(value.partition(",")[2])
    elif isinstance(value, (str, os.PathLike)):
        file = Path(value) if Path(value).is_absolute() else base_dir / value
        name = name or Path(value).name
        try:
            data = file.read_bytes()
        except OSError as exc:
            raise Geo3kDataError(f"cannot read image {file}: {exc.strerror}") from None
    else:
        raise Geo3kDataError(f"unsupported image value of type {type(value).__name__}")
    try:
        Image.open(io.BytesIO(data)).verify()
    except Exception as exc:
        raise Geo3kDataError(f"image {name or ''} does not decode: {exc}") from None
    return data, name


def build_row(
    problem: str, answer: str, images: list[dict[str, Any]], split: str, index: int | None
) -> dict[str, Any]:
    """One verl row. ``problem`` gets one ``<image>`` placeholder per image (added in front when missing)."""
    missing = len(images) - problem.count(IMAGE_TOKEN)
    if missing < 0:
        raise Geo3kDataError(
            f"the problem has {problem.count(IMAGE_TOKEN)} {IMAGE_TOKEN} placeholders but "
            f"{len(images)} images"
        )
    question = IMAGE_TOKEN * missing + problem
    return {
        "data_source": DATA_SOURCE,
        "agent_name": "tool_agent",
        "prompt": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"{question}\n{INSTRUCTION}"},
        ],
        "images": images,
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {
            "split": split,
            "index": index,
            "answer": answer,
            "question": problem,
            "need_tools_kwargs": True,
            "tools_kwargs": {TOOL_NAME: {"create_kwargs": {"ground_truth": answer}}},
        },
    }


def _schema() -> Any:
    import pyarrow as pa

    text = pa.string()
    tools_kwargs = pa.struct(
        [(TOOL_NAME, pa.struct([("create_kwargs", pa.struct([("ground_truth", text)]))]))]
    )
    return pa.schema(
        [
            ("data_source", text),
            ("agent_name", text),
            ("prompt", pa.list_(pa.struct([("role", text), ("content", text)]))),
            ("images", pa.list_(pa.struct([("bytes", pa.binary()), ("path", text)]))),
            ("ability", text),
            ("reward_model", pa.struct([("style", text), ("ground_truth", text)])),
            (
                "extra_info",
                pa.struct(
                    [
                        ("split", text),
                        ("index", pa.int64()),
                        ("answer", text),
                        ("question", text),
                        ("need_tools_kwargs", pa.bool_()),
                        ("tools_kwargs", tools_kwargs),
                    ]
                ),
            ),
        ]
    )


def convert_record(record: dict[str, Any], split: str, index: int | None, base_dir: Path) -> dict[str, Any]:
    """One geometry3k record (``problem``, ``answer``, ``images``) as a verl row; image paths are
    relative to ``base_dir``."""
    try:
        problem, answer = record["problem"], record["answer"]
    except KeyError as exc:
        raise Geo3kDataError(f"missing field {exc}") from None
    if not isinstance(problem, str) or not problem.strip():
        raise Geo3kDataError("'problem' must be a non-empty string")
    if answer is None or str(answer).strip() == "":
        raise Geo3kDataError("'answer' is empty")
    raw_images = record.get("images") or []
    if not isinstance(raw_images, list):
        raw_images = [raw_images]
    images = [dict(zip(("bytes", "path"), image_bytes(i, base_dir))) for i in raw_images]
    return build_row(problem, str(answer).strip(), images, split, index)


def convert(input_path: str | os.PathLike, split: str = "train") -> list[dict[str, Any]]:
    """The verl rows for ``split`` of the input (see the module docstring)."""
    rows = []
    for file, number, record in read_records(input_files(input_path, split)):
        try:
            rows.append(convert_record(record, split, len(rows), file.parent))
        except Geo3kDataError as exc:
            raise Geo3kDataError(f"{file}, row {number}: {exc}") from None
    if not rows:
        raise Geo3kDataError(f"{input_path}: no rows for split {split!r}")
    return rows


def write_rows(rows: list[dict[str, Any]], output_dir: str | os.PathLike, split: str) -> Path:
    """Write converted rows to ``<output_dir>/<split>.parquet``; returns its path."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{split}.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=_schema()), path)
    return path


def preprocess(input_path: str | os.PathLike, output_dir: str | os.PathLike, split: str = "train") -> Path:
    """Convert ``split`` of ``input_path`` and write ``<output_dir>/<split>.parquet``; returns its path."""
    return write_rows(convert(input_path, split), output_dir, split)
