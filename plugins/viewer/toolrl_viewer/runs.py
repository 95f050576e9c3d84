"""The directories ``toolrl view`` was given, as the page reads them: a training (or rollout) run's
metrics, read incrementally as the run appends steps, and its trajectory files; an evaluation's
``summary.json`` and ``results.jsonl``, and two evaluations compared problem by problem.
"""

from __future__ import annotations

import json
import math
import re
import threading
from pathlib import Path
from typing import Any

from toolrl.config import ConfigError
from toolrl.plugin_support import ProblemResult, problem_results, read_json

from toolrl_viewer.traces import TraceIndex

ROLLOUTS, METRICS, RESULTS, SUMMARY = "rollouts", "metrics.jsonl", "results.jsonl", "summary.json"
STEP_FILE = re.compile(r"step_(\d+)\.jsonl")
RESULTS_SOURCE = "results"  # the trajectory source name of an evaluation's results.jsonl


def flatten(row: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """A metrics row's plottable figures: numbers, and numbers inside objects as ``outer/inner``
    (per-tool latency, terminations, the staleness histogram); lists and strings are left out."""
    out: dict[str, float] = {}
    for key, value in row.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "/"))
        elif isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            out[name] = value
    return out


class Run:
    """One directory given to ``toolrl view``."""

    def __init__(self, index: int, path: Path) -> None:
        self.index, self.path = index, path
        self.name = path.name or str(path)
        self._lock = threading.Lock()
        self._offset = 0  # bytes of metrics.jsonl read so far (whole lines only)
        self._rows: list[dict[str, Any]] = []
        self._indexes: dict[str, TraceIndex] = {}

    @property
    def is_eval(self) -> bool:
        return (self.path / SUMMARY).is_file() and (self.path / RESULTS).is_file()

    def metrics(self, since: int = 0) -> list[dict[str, Any]]:
        """The rows of steps after ``since``, flattened; rows appended since the last call are read from
        where that one stopped (a line still being written waits for the next call)."""
        path = self.path / METRICS
        with self._lock:
            if path.is_file():
                if path.stat().st_size < self._offset:  # replaced (a resumed run truncates it)
                    self._offset, self._rows = 0, []
                with path.open("rb") as f:
                    f.seek(self._offset)
                    chunk = f.read()
                end = chunk.rfind(b"\n") + 1
                for line in chunk[:end].splitlines():
                    try:
                        row = json.loads(line)
                    except (json.JSONDecodeError, RecursionError, UnicodeDecodeError):
                        continue
                    if isinstance(row, dict) and isinstance(row.get("step"), int):
                        # A resumed run may repeat steps: the last row of a step wins.
                        self._rows = [r for r in self._rows if r["step"] != row["step"]]
                        self._rows.append({"step": row["step"], **flatten(row)})
                self._offset += end
            return [r for r in self._rows if r["step"] > since]

    def sources(self) -> list[str]:
        """Its trajectory files: each step's (``"12"``) in step order, and ``results`` for an evaluation."""
        found = []
        rollouts = self.path / ROLLOUTS
        if rollouts.is_dir():
            steps = [int(m.group(1)) for p in rollouts.iterdir() if (m := STEP_FILE.fullmatch(p.name))]
            found = [str(s) for s in sorted(steps)]
        if (self.path / RESULTS).is_file():
            found.append(RESULTS_SOURCE)
        return found

    def traces(self, source: str) -> TraceIndex:
        if source == RESULTS_SOURCE:
            path = self.path / RESULTS
        elif source.isdigit():
            path = self.path / ROLLOUTS / f"step_{int(source):05d}.jsonl"
        else:
            raise KeyError(f"no trajectory source {source!r}")
        if not path.is_file():
            raise KeyError(f"{self.name} has no {path.relative_to(self.path)}")
        with self._lock:
            return self._indexes.setdefault(source, TraceIndex(path))

    def summary(self) -> dict[str, Any]:
        try:
            found = read_json(self.path / SUMMARY, "summary.json")
        except ConfigError:
            return {}
        return found if isinstance(found, dict) else {}

    def describe(self) -> dict[str, Any]:
        return {"index": self.index, "name": self.name, "path": str(self.path), "eval": self.is_eval,
                "sources": self.sources()}


def per_problem(index: TraceIndex) -> dict[Any, ProblemResult]:
    """An evaluation's results by problem (the core's tally, over the index's rows)."""
    return problem_results((s.problem, s.success is True, s.reward) for s in index.rows())


def compare(a: Run, b: Run) -> dict[str, Any]:
    """Two evaluations side by side: their summaries with B − A, and each problem's successes."""
    sa, sb = a.summary(), b.summary()
    summary = []
    for key in dict.fromkeys([*sa, *sb]):
        va, vb = sa.get(key), sb.get(key)
        numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (va, vb))
        summary.append({"key": key, "a": va, "b": vb, "diff": vb - va if numbers else None})
    pa, pb = per_problem(a.traces(RESULTS_SOURCE)), per_problem(b.traces(RESULTS_SOURCE))
    problems = []
    for problem in sorted(set(pa) | set(pb)):
        row: dict[str, Any] = {"problem": problem}
        for side, found in (("a", pa.get(problem)), ("b", pb.get(problem))):
            row[side] = None if found is None else {"n": found.n, "successes": found.successes,
                                                    "reward": found.reward}
        ra, rb = pa.get(problem), pb.get(problem)
        row["diff"] = rb.success_rate - ra.success_rate if ra is not None and rb is not None else None
        problems.append(row)
    return {"a": a.name, "b": b.name, "summary": summary, "problems": problems}
