"""The GPU suite (benchmarks/gpu_suite.py) on CPU with tiny shapes: every item reports a result, or one of
the skips a CPU allows, and the JSON and markdown are written — so the suite is known to work before GPU
time is spent on it. The weight-sync items (the object store's starts a Ray cluster, which the lent GPU's
image lacks) and the MoE item run in the ``long`` session: the transports and R3 themselves have default
tests of their own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ALLOWED_SKIPS = {"sync/broadcast": "skipped: needs CUDA", "sync/object_store": "skipped: ray not installed"}
# The default run: the trainer, engine and end-to-end items (what the suite's goals rest on). The weight-sync
# and MoE items wrap code the default tests cover themselves (test_weight_transport's conformance of every
# transport, test_routing_replay's R3) and run in `long`, with the object store's.
DEFAULT = ["trainer", "engine/decode-b4", "train"]
# The checks of the fast paths against the ones they replace (static decode, one-call packed attention).
CHECKS = ["engine/static-vs-eager", "attention"]
LONG = ["sync/broadcast", "sync/shared_memory", "sync/object_store", "moe"]


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


@pytest.fixture(scope="module")
def default_run(tmp_path_factory) -> dict:
    """The default items and the checks in one suite run (the suite's own start is paid once)."""
    return run_suite(tmp_path_factory.mktemp("suite"), DEFAULT + CHECKS)


@pytest.mark.slow
def test_the_gpu_suite_runs_on_cpu(default_run):
    # Every item the two selections name, no other, in the suite's order (the checks' figures are asserted below).
    assert list(default_run) == ["trainer/tiny-256-group-shared-ckpt", "engine/decode-b4", "engine/static-vs-eager",
                                 "attention/one-call-vs-spans", "train/3-steps"]
    assert default_run["engine/decode-b4"]["decode"] == "static"


@pytest.mark.slow
def test_the_gpu_suite_checks_of_the_fast_paths_run_on_cpu(default_run):
    results = default_run
    check = results["engine/static-vs-eager"]
    assert check["greedy_identical"] == "1/1" and check["max_logprob_diff"] < 1e-4
    # On CPU one call is an sdpa call with the dense mask, in fp32: equal to rounding.
    assert len(results["attention/one-call-vs-spans"]) > 4
    assert max(v for k, v in results["attention/one-call-vs-spans"].items() if k.startswith(("qwen3", "gemma3"))) < 1e-4


@pytest.mark.slow
@pytest.mark.long
def test_the_sync_and_moe_items_run_on_cpu(tmp_path):
    pytest.importorskip("ray")
    results = run_suite(tmp_path, LONG)
    assert list(results) == ["sync/broadcast", "sync/shared_memory", "sync/object_store", "moe/r3"]
    assert results["sync/object_store"]["status"] == "ok"
