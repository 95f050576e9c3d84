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
    target = ("target: 15.0/48 held-out, the lowest of the uniform arm's 3 seeds' best (within its shortest run): "
              "every uniform seed reaches it")
    assert target in done.stdout.splitlines()
    assert "env_difficulty: tokens to target 3737 (per seed: 3669 3703 3737)" in done.stdout.splitlines()
    last = done.stdout.rstrip().splitlines()[-1]
    assert last == "tokens to target, curriculum/uniform: 0.32 [0.32, 0.40]"
    docs = (ROOT / "docs" / "benchmarks.md").read_text()
    assert target in docs and last in docs  # the output quoted as it prints
    assert "**0.32 [0.32, 0.40]**" in docs  # the headline figure, interval and all
    empty = tmp_path / "empty.txt"
    empty.write_text("machine: nothing ran\n")
    refused = _logs(empty)
    assert refused.returncode != 0 and "no untrained line" in refused.stderr and "Traceback" not in refused.stderr
