"""benchmarks/_common.py's tokens-to-target helpers: the seed-bootstrap interval of a ratio (reproducible for
a fixed seed; an arm that never reaches the target widens it to inf; identical arms straddle 1, a clearly
faster arm stays below it) and the target every seed reaches."""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from _common import ratio_line, ratio_to_target, seed_target  # noqa: E402

GRID = [float(t) for t in range(0, 101, 10)]


def ramp(slope: float) -> list[float]:
    """A seed's success on GRID, rising ``slope`` per token to at most 1."""
    return [min(1.0, slope * t) for t in GRID]


BASE = (GRID, [ramp(0.010), ramp(0.012), ramp(0.014), ramp(0.020), ramp(0.009)])


def test_the_interval_is_reproducible_for_a_fixed_seed():
    fast = (GRID, [ramp(0.02), ramp(0.03), ramp(0.025), ramp(0.05), ramp(0.02)])
    first = ratio_to_target(0.8, fast, BASE, resamples=500, rng_seed=7)
    assert ratio_to_target(0.8, fast, BASE, resamples=500, rng_seed=7) == first
    assert first != ratio_to_target(0.8, fast, BASE, resamples=500, rng_seed=8)


def test_an_arm_that_never_reaches_the_target_is_inf():
    stuck = (GRID, [ramp(0.002), ramp(0.003), ramp(0.004)])
    point, lo, hi = ratio_to_target(0.8, stuck, BASE, resamples=200)
    assert point is None and lo == hi == math.inf
    assert ratio_line("stuck/base", point, lo, hi) == "tokens to target, stuck/base: n/a [inf, inf]"
    # One seed of three never gets there: the mean of all three does, a quarter of the resamples' do not.
    sometimes = (GRID, [ramp(0.02), ramp(0.002), ramp(0.03)])
    point, lo, hi = ratio_to_target(0.6, sometimes, BASE, resamples=500)
    assert point is not None and math.isfinite(lo) and hi == math.inf


def test_identical_arms_straddle_one_and_a_faster_arm_stays_below():
    point, lo, hi = ratio_to_target(0.8, BASE, BASE, resamples=500)
    assert point == 1.0 and lo < 1.0 < hi
    fast = (GRID, [ramp(0.04), ramp(0.05), ramp(0.045), ramp(0.06), ramp(0.04)])
    point, lo, hi = ratio_to_target(0.8, fast, BASE, resamples=500)
    assert point is not None and lo <= point <= hi < 1.0
    line = ratio_line("fast/base", point, lo, hi)
    assert line == f"tokens to target, fast/base: {point:.2f} [{lo:.2f}, {hi:.2f}]"


def test_the_target_is_a_level_every_seed_reaches():
    rows = [[0.1, 0.6, 0.4], [0.2, 0.3, 0.5], [0.0, 0.9, 0.9]]
    assert seed_target(rows) == 0.5
