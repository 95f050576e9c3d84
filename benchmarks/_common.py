"""Shared helpers for the benchmarks: single-threaded torch, summary tables, timing statistics, learning
curves over tokens and seed-bootstrap intervals of tokens-to-target ratios.

Import this module before torch: :func:`single_thread` must set ``OMP_NUM_THREADS`` before the
OpenMP runtime starts, because multithreaded OpenMP stalls unpredictably on the shared 2-core VMs
(``../shared/notes/cpu-grpo-baseline-trl.md`` §5) and timings would not be comparable.
"""

from __future__ import annotations

import json
import math
import os
import platform
import random
import socket
import statistics
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any


def single_thread() -> None:
    """One intra-op and one inter-op thread everywhere (call before and after importing torch)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")
    if "torch" in sys.modules:
        import torch

        torch.set_num_threads(1)


def machine() -> str:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{platform.machine()} · {os.cpu_count()} CPUs · load avg {load:.2f} · "
            f"python {platform.python_version()} · OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}")


def free_port() -> int:
    """A loopback port free now (for a server or a process group the benchmark starts)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain aligned text table (numbers right-aligned)."""
    cells = [[str(h) for h in headers]] + [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    numeric = [all(_is_number(row[i]) for row in rows) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if num else c.ljust(w) for c, w, num in zip(row, widths, numeric)).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), sep, *(line(r) for r in cells[1:])])


def tokens_to(target: float, points: Sequence[tuple[float, float]]) -> float | None:
    """Where a (tokens, success) curve first reaches ``target``, linear between its points."""
    for (t0, s0), (t1, s1) in zip(points, points[1:]):
        if s0 >= target:
            return t0
        if s1 >= target:
            return t0 + (t1 - t0) * (target - s0) / (s1 - s0)
    return points[-1][0] if points and points[-1][1] >= target else None


def mean_curve(curves: Sequence[Sequence[tuple[float, float]]], marks: Sequence[float]) -> list[float]:
    """The seed mean at ``marks`` tokens, each seed's curve linear between its points."""
    def value(curve: Sequence[tuple[float, float]], x: float) -> float:
        for (t0, s0), (t1, s1) in zip(curve, curve[1:]):
            if t0 <= x <= t1:
                return s0 + (s1 - s0) * (x - t0) / max(t1 - t0, 1e-9)
        return curve[-1][1]
    return [statistics.mean(value(c, x) for c in curves) for x in marks]


def seed_table(values: Mapping[str, Sequence[Sequence[float | None]]], marks: Sequence[float],
               digits: int = 2) -> str:
    """Every seed's curve, a row per arm and seed (in the arm's seed order) at ``marks`` tokens, ``-`` past
    the run's end: the spread that a seed mean hides."""
    rows = [[arm, i, *("-" if v is None else f"{v:.{digits}f}" for v in seed)]
            for arm, seeds in values.items() for i, seed in enumerate(seeds)]
    return table(["arm", "seed", *(f"{m:.0f}" for m in marks)], rows)


def seed_target(rows: Sequence[Sequence[float]]) -> float:
    """The level every seed reaches: the lowest of the seeds' best values (each seed's values on a grid)."""
    return min(max(row) for row in rows)


def mean_tokens_to(target: float, grid: Sequence[float], rows: Sequence[Sequence[float]]) -> float | None:
    """Where the seed mean of ``rows`` (each seed's values at ``grid`` tokens) first reaches ``target``."""
    return tokens_to(target, [(t, sum(col) / len(col)) for t, col in zip(grid, zip(*rows), strict=True)])


Arm = tuple[Sequence[float], Sequence[Sequence[float]]]  # an arm's grid of tokens, each seed's values on it
Memo = dict[tuple[int, ...], float]  # a sorted draw of an arm's seed indices: its tokens to target
RESAMPLES = 2000  # seed bootstraps per interval: cheap, each distinct draw's mean curve is computed once


def ratio_to_target(target: float, arm: Arm, base: Arm, resamples: int = RESAMPLES,
                    rng_seed: int = 0) -> tuple[float | None, float, float]:
    """Tokens to ``target``, ``arm`` / ``base``: on all seeds (None where either mean never reaches it) and
    the 5th and 95th percentiles over ``resamples`` seed bootstraps (each arm's seeds drawn with replacement,
    independently; ``rng_seed`` fixes the draws). A resample whose arm never reaches the target counts as inf,
    above any finite ratio; one where only the base never does, as 0."""
    rng = random.Random(rng_seed)

    def draw(grid: Sequence[float], rows: Sequence[Sequence[float]], memo: Memo) -> float:
        picks = tuple(sorted(rng.choices(range(len(rows)), k=len(rows))))
        if picks not in memo:  # few seeds make few distinct draws (10 for 3 seeds): each mean curve once
            got = mean_tokens_to(target, grid, [rows[i] for i in picks])
            memo[picks] = math.inf if got is None else got
        return memo[picks]

    memos: tuple[Memo, Memo] = ({}, {})
    ratios = sorted(_ratio(draw(*arm, memos[0]), draw(*base, memos[1])) for _ in range(resamples))
    a, b = mean_tokens_to(target, *arm), mean_tokens_to(target, *base)
    point = None if a is None or b is None else _ratio(a, b)
    return point, ratios[round(0.05 * (resamples - 1))], ratios[round(0.95 * (resamples - 1))]


def ratio_line(name: str, point: float | None, lo: float, hi: float) -> str:
    """The benchmarks' last line: ``tokens to target, NAME: X.XX [lo, hi]`` (``inf``: the arm fell short of
    the target in too many resamples; ``n/a``: a mean on all seeds never reached it)."""
    return f"tokens to target, {name}: {'n/a' if point is None else f'{point:.2f}'} [{lo:.2f}, {hi:.2f}]"


def report_curves(curves: Mapping[str, Sequence[Sequence[tuple[float, float]]]], what: str, of: int,
                  seeds: str) -> dict[str, float]:
    """The arms' seed-mean curves, then every seed's, at 9 token marks (``what``: the figure, e.g. ``held-out
    games won``, of ``of``); returns each arm's shortest run in tokens (its curves are compared within it)."""
    ends = {arm: min(c[-1][0] for c in cs) for arm, cs in curves.items()}
    marks = [max(ends.values()) * k / 8 for k in range(9)]
    print(f"\n{what} of {of} (mean over {seeds}) at generated tokens")
    print(table(["arm", *[f"{m:.0f}" for m in marks]],
                [[arm, *[f"{v:.1f}" if m <= ends[arm] else "-" for m, v in zip(marks, mean_curve(cs, marks))]]
                 for arm, cs in curves.items()]))
    print(f"\n{what} by every seed at the same tokens")
    print(seed_table({arm: [[v if m <= c[-1][0] else None for m, v in zip(marks, mean_curve([c], marks))]
                            for c in cs] for arm, cs in curves.items()}, marks, digits=1))
    return ends


def on_grids(curves: Mapping[str, Sequence[Sequence[tuple[float, float]]]],
             ends: Mapping[str, float]) -> dict[str, tuple[list[float], list[list[float]]]]:
    """Each arm's grid of 401 token counts within its shortest run (``ends``) and every seed's curve on it."""
    grids = {arm: [ends[arm] * k / 400 for k in range(401)] for arm in curves}
    return {arm: (grids[arm], [mean_curve([c], grids[arm]) for c in cs]) for arm, cs in curves.items()}


def report_ratios(curves: Mapping[str, Sequence[Sequence[tuple[float, float]]]], ends: Mapping[str, float],
                  base: str, contenders: Sequence[str], last: str, of: str) -> None:
    """Each arm's seeds on a grid within its shortest run (``ends``), the target (:func:`seed_target` of the
    ``base`` arm's seeds: a level every one of them reaches; ``of``: what it counts, e.g. ``24 held-out won``),
    each arm's tokens to it, its ratio to ``base``'s with the seed-bootstrap interval, and the last line
    ``tokens to target, LAST: ...`` for the better of ``contenders`` by point estimate. Where the base arm's
    seeds never rise above where every arm starts, a target there is reached at 0 tokens and says nothing:
    the last line says there is none."""
    arms = on_grids(curves, ends)
    target, start = seed_target(arms[base][1]), arms[base][1][0][0]
    if target <= start:
        print(f"\ntarget: none: a {base} seed never rose above the untrained {start:.1f}/{of}")
        print(f"tokens to target, {last}: n/a [no target: the {base} arm did not learn]")
        return
    print(f"\ntarget: {target:.1f}/{of}, the lowest of the {base} arm's {len(curves[base])} seeds' best (within its "
          f"shortest run): every {base} seed reaches it")
    for arm, (grid, rows) in arms.items():
        reached = mean_tokens_to(target, grid, rows)
        print(f"{arm}: tokens to target {f'not within its {ends[arm]:.0f}' if reached is None else f'{reached:.0f}'}"
              " (per seed: " + " ".join("never" if t is None else f"{t:.0f}" for t in
                                        (tokens_to(target, list(zip(grid, row))) for row in rows)) + ")")
    ratios = {arm: ratio_to_target(target, arms[arm], arms[base]) for arm in arms if arm != base}
    best = min((a for a in contenders if a in ratios), default=None,
               key=lambda a: (ratios[a][0] is None, ratios[a][0] or 0.0))
    print(f"\nratios of tokens to target to {base}'s [90% interval, {RESAMPLES} seed bootstraps of each arm]")
    for arm, ratio in ratios.items():
        print(ratio_line(f"{arm}/{base}", *ratio))
    print(f"the better of {' and '.join(contenders)} by point estimate: {best or 'none run'}")
    print(f"tokens to target, {last}: n/a (none of them ran)" if best is None else ratio_line(last, *ratios[best]))


def report_other_targets(curves: Mapping[str, Sequence[Sequence[tuple[float, float]]]], ends: Mapping[str, float],
                         base: str, targets: Sequence[float], of: str) -> None:
    """Each arm's tokens to each of ``targets`` and its ratio to ``base``'s with the seed-bootstrap interval, as
    :func:`report_ratios` computes them at its one target: how the figure moves with the target, read beside the
    protocol's (never in its place)."""
    arms = on_grids(curves, ends)
    print(f"\nother targets (not the protocol's; {of}): each arm's tokens to it; its ratio to {base}'s [90% interval]")
    for target in targets:
        tokens = []
        for arm in arms:
            got = mean_tokens_to(target, *arms[arm])
            tokens.append(f"{arm} {'never' if got is None else f'{got:.0f}'}")
        ratios = []
        for arm in (a for a in arms if a != base):
            point, lo, hi = ratio_to_target(target, arms[arm], arms[base])
            ratios.append(f"{arm}/{base} {'n/a' if point is None else f'{point:.2f}'} [{lo:.2f}, {hi:.2f}]")
        print(f"{target:g}: {', '.join(tokens)}; {', '.join(ratios)}")


def _ratio(a: float, b: float) -> float:
    if a == math.inf:
        return math.inf
    if b == 0:  # the base is at the target from the start: the arm is as fast only if it is too
        return 1.0 if a == 0 else math.inf
    return a / b


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 100 else f"{value:.1f}"
    return str(value)


def run_child(script: str, args: Sequence[str], label: str) -> dict[str, Any]:
    """``script`` (a benchmark, in its ``--child`` mode) run in a fresh single-threaded process, so its
    peak memory and timings are its own; the JSON object on its last line of output."""
    res = subprocess.run([sys.executable, script, *args], capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    if res.returncode != 0:
        raise SystemExit(f"{label} failed (exit {res.returncode}):\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])
