"""Curricula against uniform draws: held-out success over generated tokens, SmolLM2-135M-Instruct learning
reasoning-gym's ``chain_sum`` at levels from what it can do to what it cannot.

The task is ``examples/reasoning_gym.yaml``'s (LoRA rank 16, two worked examples as the prompt prefix, 8
samples a prompt at temperature 0.7, answers of at most 24 tokens) over four levels of the generator's
reasoning-gym curriculum (``env_options.levels``): two one-digit terms (the untrained model solves about
one in six: what it can do), two two-digit terms, three one-digit terms, three two-digit terms (next to
none at the start; a third term is harder for it than a second digit). The training split holds ``--train`` prompts a level (few, so that a prompt comes back and its
pass rate means something); the held-out split, fixed, ``--held-out`` a level, solved or not at the
generator's full score, greedy.

Four arms from the same untrained model, ``--seeds`` seeds each (``trainer.seed`` and ``rollout.seed``):

- ``uniform``: the data's own order (``data.curriculum: {name: uniform}``, named so its figures are recorded);
- ``dynamic``: uniform draws with DAPO's dynamic sampling (``algorithm.skip_zero_variance_groups``: a step
  generates up to 4 batches' worth of groups to fill its batch with groups that teach; their tokens count);
  it runs ``--dynamic-steps`` steps (fewer: each generates more);
- ``pass_rate``: the pass-rate pools (``shares: {normal: 1}``, a revisit in ten, a prompt's last 2 groups);
- ``env_difficulty``: the environment's levels from the easiest, a level up at a pass rate of ``--up`` over 8
  groups at it, down at ``--down``.

Generated tokens are the model's tokens (``response_mask`` 1) of every trajectory a step generated, trained or
skipped (``rollouts/step_NNNNN.jsonl``). The held-out split is evaluated before training (once: every arm
starts from it) and every ``--eval-every`` steps; each seed's curve is linear between its evaluations and
the arm's curve is the seed mean. The target is the level every seed of the uniform arm reaches: the lowest
of its seeds' best held-out success, within its shortest run's tokens (until the seed-bootstrap intervals
came, the uniform arm's final mean success: figures recorded before are on that target). An arm's tokens to
target are where its curve first reaches it; each ratio to uniform's comes with a 90% interval over 2,000
seed bootstraps (each arm's seeds resampled with replacement, a fixed RNG; a resample whose arm never
reaches the target counts as inf). Every seed's curve is printed too. Last line:

    tokens to target, curriculum/uniform: X.XX [lo, hi]

(curriculum: the better of ``pass_rate`` and ``env_difficulty``; below 1: fewer tokens than uniform draws
needed, the issue's goal ≤ 0.7; ``n/a``: a seed mean never reached the target). Runs go ``--jobs`` at a
time, each a process of its own, single-threaded.

    OMP_NUM_THREADS=1 python benchmarks/curriculum.py [--quick] [--seeds 3] [--steps 12] [--jobs 2]
        [--first-seed 0] [--logs OUTPUT ...]

``--first-seed`` and ``--logs`` split the seeds over several runs: each run's output kept, ``--logs`` prints the
figures of all their per-seed lines together, running nothing.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from _common import (
    machine,
    report_curves,
    report_ratios,
    run_child,
    single_thread,
)

single_thread()

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "reasoning_gym.yaml"
# The levels of chain_sum's curriculum (num_terms levels 2, 3, ...; num_digits levels 1, 2, ...), easiest first
# as the model finds them: a third term is harder for it than a second digit.
LEVELS = "[{}, {num_digits: 1}, {num_terms: 1}, {num_terms: 1, num_digits: 1}]"
SHAPES = ((2, 1), (2, 2), (3, 1), (3, 2))  # each level's terms and digits
LEVEL_NAMES = tuple(f"{terms} terms, {digits} digit{'s' * (digits > 1)}" for terms, digits in SHAPES)
ARMS = ("uniform", "dynamic", "pass_rate", "env_difficulty")


def arm_overrides(arm: str, args: argparse.Namespace) -> list[str]:
    return {
        "uniform": ["data.curriculum={name: uniform}"],
        "dynamic": ["data.curriculum={name: uniform}", "algorithm.skip_zero_variance_groups=true",
                    f"trainer.total_steps={args.dynamic_steps}"],
        "pass_rate": ["data.curriculum={name: pass_rate, shares: {normal: 1.0}, revisit: 0.1, window: 2}"],
        "env_difficulty": [f"data.curriculum={{name: env_difficulty, window: 8, up: {args.up}, down: {args.down}}}"],
    }[arm]


def settings(out: Path, seed: int, args: argparse.Namespace, *extra: str) -> list[str]:
    """The task (module docstring) for a run into ``out``."""
    levels = len(LEVEL_NAMES)
    return [f"env_options={{dataset: chain_sum, size: {args.train * levels}, test_size: {args.held_out * levels}, "
            f"seed: 0, levels: {LEVELS}}}", f"eval.num_samples={args.held_out * levels}", "eval.success_threshold=1.0",
            f"trainer.output_dir={out}", f"trainer.seed={seed}", f"rollout.seed={seed}", f"trainer.total_steps={args.steps}",
            f"trainer.eval_every={args.eval_every}", "trainer.save_every=100000", "trainer.plot=false",
            "trainer.progress=false", f"data.batch_size={args.batch}", *extra]


def by_level(rows: Sequence[dict[str, Any]]) -> list[int]:
    """Solved held-out problems per level."""
    solved = [0] * len(LEVEL_NAMES)
    for r in rows:
        config = r["ground_truth"]["config"]
        level = SHAPES.index((config["min_terms"], config["min_digits"]))
        solved[level] += r["reward_terms"].get("reasoning_gym", 0.0) >= 1.0
    return solved


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").split("\n") if x.strip()]


def child(args: argparse.Namespace) -> int:
    """One run (``--child ARM SEED OUT``, or ``before`` for the untrained model's evaluation); its figures as
    one JSON line."""
    from toolrl.config import load_config

    arm, seed, out = args.child[0], int(args.child[1]), Path(args.child[2])
    if arm == "before":
        from toolrl.processes.evaluate import run_evaluation

        config = load_config(EXAMPLE, settings(out / "run", seed, args))
        run_evaluation(config, out, progress=False)
        print(json.dumps({"by_level": by_level(lines(out / "results.jsonl"))}))
        return 0
    import asyncio

    from toolrl.processes.controller import train_async

    t0 = time.perf_counter()
    asyncio.run(train_async(load_config(EXAMPLE, settings(out, seed, args, *arm_overrides(arm, args)))))
    points, tokens, figures = [], 0, []
    for row in lines(out / "metrics.jsonl"):
        step = row["step"]
        tokens += sum(sum(t["response_mask"]) for t in lines(out / "rollouts" / f"step_{step:05d}.jsonl"))
        figures.append(row.get("curriculum", {}))
        if (out / "eval" / f"step_{step:05d}.jsonl").exists():
            solved = by_level(lines(out / "eval" / f"step_{step:05d}.jsonl"))
            points.append({"step": step, "tokens": tokens, "by_level": solved})
    print(json.dumps({"points": points, "wall_s": time.perf_counter() - t0, "curriculum": figures}))
    return 0


def curriculum_line(arm: str, figures: Sequence[dict[str, Any]]) -> str:
    """The run's curriculum figures in one line: the zero-variance share by step, and the levels or pools."""
    zero = " ".join(f"{f.get('zero_variance', float('nan')):.2f}" for f in figures)
    if arm == "env_difficulty":
        return f"zero-variance share {zero}; level " + " ".join(str(f["level"]["reasoning_gym"]) for f in figures)
    if arm == "pass_rate":
        return f"zero-variance share {zero}; avoided " + " ".join(f"{f.get('avoided', 0.0):.2f}" for f in figures)
    return f"zero-variance share {zero}"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 seed, 4 steps of 4 prompts, 2 held-out problems a level: "
                    "a smoke run")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--first-seed", type=int, default=0, help="the seeds run are first-seed, first-seed + 1, ...")
    ap.add_argument("--logs", nargs="+", type=Path, help="no runs: the figures of the per-seed lines these earlier "
                                                          "outputs of this script printed (seeds split over runs)")
    ap.add_argument("--steps", type=int, default=12, help="steps of each run (dynamic: --dynamic-steps)")
    ap.add_argument("--dynamic-steps", type=int, default=None, help="steps of the dynamic arm (default: half of --steps)")
    ap.add_argument("--batch", type=int, default=8, help="prompts a step (8 samples each)")
    ap.add_argument("--eval-every", type=int, default=2, help="held-out evaluation every this many steps (the "
                    "curves rise in the first few)")
    ap.add_argument("--train", type=int, default=16, help="training prompts a level (16: an epoch every 8 steps of 8)")
    ap.add_argument("--held-out", type=int, default=12, help="held-out problems a level")
    ap.add_argument("--up", type=float, default=0.6, help="env_difficulty: the pass rate that moves a level up")
    ap.add_argument("--down", type=float, default=0.1, help="env_difficulty: the pass rate that moves a level down")
    ap.add_argument("--arms", default=",".join(ARMS), help="the arms to run (comma-separated)")
    ap.add_argument("--jobs", type=int, default=2, help="runs at once, each single-threaded")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.quick:
        args.seeds, args.steps, args.batch, args.eval_every, args.held_out, args.train = 1, 4, 4, 2, 2, 4
    args.dynamic_steps = args.dynamic_steps or max(args.steps // 2, 1)
    if args.child:
        return child(args)
    if args.logs:
        curves, problems = from_logs(args.logs)
        return report(curves, problems, f"{max(map(len, curves.values()))} seeds, from " + ", ".join(map(str, args.logs)))
    arms = [a for a in args.arms.split(",") if a]
    common = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()
              if k in ("steps", "dynamic_steps", "batch", "eval_every", "train", "held_out", "up", "down")]
    problems = args.held_out * len(LEVEL_NAMES)
    print(f"machine: {machine()}")
    print(f"workload: SmolLM2-135M-Instruct (LoRA r16), chain_sum at {len(LEVEL_NAMES)} levels ({'; '.join(LEVEL_NAMES)}), "
          f"{args.train} training prompts and {args.held_out} held-out problems a level; {args.steps} steps × "
          f"{args.batch} prompts × 8 samples (dynamic: {args.dynamic_steps} steps); seeds {args.first_seed}-{args.first_seed + args.seeds - 1}; "
          f"held-out every {args.eval_every} steps, greedy; {args.jobs} runs at once\n", flush=True)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="curriculum-") as tmp:
        base = Path(tmp)
        before = run_child(__file__, ["--child", "before", "0", str(base / "before"), *common], "before")["by_level"]
        print(f"untrained: {sum(before)}/{problems} held-out ({' '.join(map(str, before))} by level)", flush=True)
        seeds = range(args.first_seed, args.first_seed + args.seeds)
        jobs = [(arm, seed) for seed in seeds for arm in arms]

        def one(job: tuple[str, int]) -> dict[str, Any]:
            arm, seed = job
            got = run_child(__file__, ["--child", arm, str(seed), str(base / f"{arm}-{seed}"), *common], f"{arm} seed {seed}")
            print(f"{arm} seed {seed}: {got['wall_s']:.0f} s; held-out at tokens (by level): "
                  + " ".join(f"{sum(p['by_level'])}@{p['tokens']}({'/'.join(map(str, p['by_level']))})"
                             for p in got["points"]) + f"; {curriculum_line(arm, got['curriculum'])}", flush=True)
            return got

        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            results = dict(zip(jobs, pool.map(one, jobs), strict=True))
    curves = {arm: [[(0.0, float(sum(before))), *((float(p["tokens"]), float(sum(p["by_level"])))
                                                  for p in results[(arm, seed)]["points"])]
                    for seed in seeds] for arm in arms}
    return report(curves, problems, f"{args.seeds} seeds; {time.perf_counter() - t0:.0f} s in all")


def from_logs(paths: Sequence[Path]) -> tuple[dict[str, list[list[tuple[float, float]]]], int]:
    """Each arm's curve per seed, and the held-out problems, from the lines earlier outputs of this script
    printed (the untrained line and the per-seed lines)."""
    before, problems, runs = None, 0, {}
    for path in paths:
        for line in path.read_text(encoding="utf-8").splitlines():
            if m := re.match(r"untrained: (\d+)/(\d+)", line):
                before, problems = float(m.group(1)), int(m.group(2))
            elif m := re.match(r"(\w+) seed (\d+): \d+ s; held-out at tokens \(by level\): (.*?);", line):
                runs[(m.group(1), int(m.group(2)))] = [(float(t), float(n)) for n, t in re.findall(r"(\d+)@(\d+)\(", m.group(3))]
    if before is None or not runs:
        raise SystemExit(f"--logs: no untrained line or no per-seed line in {', '.join(map(str, paths))}")
    return {arm: [[(0.0, before), *runs[key]] for key in sorted(runs) if key[0] == arm]
            for arm in ARMS if any(key[0] == arm for key in runs)}, problems


def report(curves: dict[str, list[list[tuple[float, float]]]], problems: int, seeds: str) -> int:
    """The arms' mean curves and every seed's, the target (module docstring) and each arm's tokens to it,
    each arm's ratio to the uniform arm's with its seed-bootstrap interval, and the last line."""
    ends = report_curves(curves, "held-out successes", problems, seeds)
    if "uniform" not in curves:
        return 0
    report_ratios(curves, ends, "uniform", ("pass_rate", "env_difficulty"), "curriculum/uniform",
                  f"{problems} held-out")
    return 0


if __name__ == "__main__":
    sys.exit(main())
