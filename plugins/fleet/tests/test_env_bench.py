"""``toolrl env bench NAME``: N concurrent trajectories of an installed environment driven by a scripted
policy through the rollout's session machinery (toolrl_fleet.load), in-process and through a fleet of
environment servers the ``fleet`` kind starts; every trajectory completes, none masked or lost. Figures
are the benchmark's (benchmarks/env_load.py), not asserted here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import counter_session, install, run_toolrl

# The docs' counter served as an environment's session (its goal ends a trajectory after 3 steps).
COUNTING = '''
from toolrl.environments import Environment


@hookimpl
def register_environments(register):
    register(Environment(name="counting", splits={"train": lambda options, split: [{"prompt": "count"}] * 4},
                         session="counter", session_options={"goal": 3}), name="counting")
'''
BENCH = ("env", "bench", "counting", "--ladder", "2,12", "--steps", "5", "--think-s", "0.01", "--json")


@pytest.fixture
def counting(tmp_path: Path) -> Path:
    install(tmp_path, "counting", counter_session() + COUNTING)
    return tmp_path


@pytest.mark.parametrize("through", [(), ("--session", "fleet", "--session-options",
                                          '{"serve": "counting", "servers": 2, "capacity": 8}')],
                         ids=["in-process", "fleet"])
def test_bench_drives_every_trajectory_to_its_end(counting: Path, through: tuple[str, ...]) -> None:
    result = run_toolrl(*BENCH, *through, path=counting)
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


def test_bench_names_what_is_wrong_with_the_fleets_options(counting: Path) -> None:
    result = run_toolrl("env", "bench", "counting", "--session", "fleet", path=counting)
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert result.stderr.startswith("error: --session-options: give urls"), result.stderr
