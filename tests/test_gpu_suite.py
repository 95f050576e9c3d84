"""The GPU suite (benchmarks/gpu_suite.py) on CPU with tiny shapes: every item reports a result, or one of
the skips a CPU allows, and the JSON and markdown are written — so the suite is known to work before GPU
time is spent on it. The object-store item starts a Ray cluster (half a minute more) and cannot run on the
lent GPU's image, which has no Ray: it runs in the ``long`` session."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ALLOWED_SKIPS = {"sync/broadcast": "skipped: needs CUDA", "sync/object_store": "skipped: ray not installed"}
DEFAULT = ["trainer", "engine", "sync/broadcast", "sync/shared_memory", "moe", "train"]


def run_suite(out: Path, only: list[str]) -> dict:
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_suite.py"), "--device", "cpu", "--smoke",
                          "--out", str(out), "--only", ",".join(only)], capture_output=True, text=True, timeout=400,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    results = json.loads((out / "gpu_suite.json").read_text())["results"]
    for name, r in results.items():
        assert r["status"] == "ok" or r["status"] == ALLOWED_SKIPS.get(name), (name, r["status"])
        assert f"{name}: " in res.stdout
    md = (out / "gpu_suite.md").read_text()
    assert all(f"| {name} |" in md for name in results) and "MFU =" in md
    return results


@pytest.mark.slow
def test_the_gpu_suite_runs_on_cpu(tmp_path):
    results = run_suite(tmp_path, DEFAULT)
    assert len(results) == 6 and "sync/object_store" not in results


@pytest.mark.slow
@pytest.mark.long
def test_the_object_store_item_runs_on_a_local_ray(tmp_path):
    pytest.importorskip("ray")
    results = run_suite(tmp_path, ["sync/object_store"])
    assert list(results) == ["sync/object_store"] and results["sync/object_store"]["status"] == "ok"
