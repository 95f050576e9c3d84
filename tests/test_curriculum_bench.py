"""benchmarks/curriculum.py's figures from the outputs it printed (``--logs``): the 3-seed figure recorded in
docs/benchmarks.md is what the committed outputs of its two parts give, and a log without runs is one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "docs" / "benchmark_runs"


def _logs(*paths: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "curriculum.py"), "--logs", *map(str, paths)],
                          capture_output=True, text=True, timeout=120)


def test_the_recorded_figure_is_the_three_seeds_outputs(tmp_path):
    done = _logs(RUNS / "curriculum-seeds-0-1.txt", RUNS / "curriculum-seed-2.txt")
    assert done.returncode == 0, done.stderr
    assert "mean over 3 seeds" in done.stdout
    assert "env_difficulty: tokens to 14.7/48 (the uniform arm's final): 3378" in done.stdout
    assert done.stdout.rstrip().endswith("tokens to target, curriculum/uniform: 0.36")
    assert "**0.36**" in (ROOT / "docs" / "benchmarks.md").read_text()
    empty = tmp_path / "empty.txt"
    empty.write_text("machine: nothing ran\n")
    refused = _logs(empty)
    assert refused.returncode != 0 and "no untrained line" in refused.stderr and "Traceback" not in refused.stderr
