"""``toolrl env bench NAME``: N concurrent trajectories of an installed environment driven by a scripted
policy through the rollout's session machinery (toolrl.testing.load); every trajectory completes, none
masked or lost (through a fleet of environment servers: the fleet plugin's tests). Figures are the
benchmark's (benchmarks/env_load.py), not asserted here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _dists import make_dist, run_toolrl
from test_scripted_engine import DOCS, fenced

ENVIRONMENT = '''
from toolrl.environments import Environment

COUNTING = Environment(name="counting", splits={"train": lambda options, split: [{"prompt": "count"}] * 4},
                       session="counter", session_options={"goal": 3})


@hookimpl
def register_environments(register):
    register(COUNTING, name="counting")
'''


@pytest.fixture
def counting(tmp_path: Path) -> Path:
    session = fenced((DOCS / "plugins.md").read_text(), "python", "class Counter(EnvironmentSession)")
    make_dist(tmp_path, "toolrl-plugin-counting", "counting", "toolrl_counting", session + ENVIRONMENT)
    return tmp_path


def test_bench_drives_every_trajectory_to_its_end(counting: Path) -> None:
    result = run_toolrl("env", "bench", "counting", "--ladder", "2,12", "--steps", "5", "--think-s", "0.01",
                        "--json", path=counting)
    assert result.returncode == 0, result.stderr
    rungs = json.loads(result.stdout)
    assert [r["n"] for r in rungs] == [2, 12]
    for r in rungs:  # the counter's goal (3) ends each trajectory after 3 of its 5 steps
        assert (r["completed"], r["masked"], r["lost"], r["errors"]) == (r["n"], 0, 0, {})
        assert r["steps"] == 3 * r["n"] and r["p99_s"] >= r["p50_s"] > 0


def test_bench_names_what_is_wrong(counting: Path) -> None:
    for ladder in ("0", "4,x", "4,,8"):
        result = run_toolrl("env", "bench", "counting", "--ladder", ladder, path=counting)
        assert result.returncode == 2 and "Invalid value for '--ladder'" in result.stderr, result.stderr
        assert "a whole number, at least 1" in result.stderr
