"""Datasets in verl's format (JSONL or parquet rows with ``prompt`` messages,
``reward_model.ground_truth``, ``extra_info.tools_kwargs``, ``data_source``) and a synthetic
arithmetic task for demos and tests."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from toolrl.config import ConfigError, SyntheticData
from toolrl.schemas import Sample


def _rows(path: Path) -> list[dict[str, Any]]:
    if path.suffix in (".jsonl", ".json"):
        rows = []
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ConfigError(f"{path}:{n}: invalid JSON: {exc.msg}") from None
        return rows
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    raise ConfigError(f"{path}: unsupported data file (use .jsonl or .parquet)")


def load_samples(paths: list[Path]) -> list[Sample]:
    samples: list[Sample] = []
    for path in paths:
        if not path.exists():
            raise ConfigError(f"data.train_files: {path} does not exist")
        for n, row in enumerate(_rows(path)):
            try:
                sample = Sample.model_validate(row)
            except ValidationError as exc:
                raise ConfigError(f"{path} row {n}: {exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}") from None
            if sample.index is None:
                sample.index = len(samples)
            samples.append(sample)
    if not samples:
        raise ConfigError("data.train_files: no rows")
    return samples


def arithmetic_samples(spec: SyntheticData) -> list[Sample]:
    """``What is 37 * 58?`` style questions whose ground truth is the integer result."""
    rng = random.Random(spec.seed)
    samples = []
    for i in range(spec.num_samples):
        a, b = rng.randint(2, spec.max_operand), rng.randint(2, spec.max_operand)
        op = rng.choice(spec.operators)
        answer = {"+": a + b, "-": a - b, "*": a * b}[op]
        samples.append(Sample(
            prompt=[{"role": "user", "content": f"What is {a} {op} {b}? {spec.instruction}".strip()}],
            ground_truth=str(answer),
            data_source="toolrl/arithmetic",
            index=i,
        ))
    return samples


def write_jsonl(samples: list[Sample], path: Path) -> None:
    """Write samples back in verl's row layout."""
    with path.open("w") as f:
        for s in samples:
            row = {
                "data_source": s.data_source,
                "prompt": [m.to_template() for m in s.prompt],
                "reward_model": {"style": "rule", "ground_truth": s.ground_truth},
                "extra_info": {**s.extra_info, "index": s.index,
                               "tools_kwargs": {k: v.model_dump() for k, v in s.tools_kwargs.items()}},
            }
            f.write(json.dumps(row) + "\n")
