"""Credit assignment and curricula on TextWorld (issue 104, points 2–4): held-out plays won over generated
tokens, SmolLM2-135M-Instruct learning generated TextWorld games, two claims, each a fixed protocol.

The task is ``examples/textworld.yaml``'s (LoRA rank 16; ``custom`` games; each turn the model answers the
number of one of the listed admissible commands but look, inventory and examine, ≤ 4 tokens; a worked game
won by its walkthrough before each one; 4 games a step × 8 samples at temperature 1; reward 1 for a win plus
the score delta as step reward). A held-out play is won when its result row's ``reward_terms["textworld"]``
is 1; the held-out games are never trained on (the plugin drops a training game that is one of them), each
played :data:`PLAYS` times at temperature 1 as in training (greedy play never moved in the demo's five runs:
on these games GRPO sharpens the policy the sampler plays, docs/benchmarks.md), before training (once: every
arm starts from it) and every ``--eval-every`` steps (``trainer.eval_every``); the figures count plays won.
The games are fixed: ``env_options.seed`` 0 for every arm and seed; seeds are
``trainer.seed`` and ``rollout.seed``, 5 of them (0–4).

``--claim credit`` (:data:`CREDIT`): rooms 2, objects 2, quest length 2, ``max_steps`` 5, 64 training games,
24 held-out. Arms ``grpo`` (the default advantage), ``gigpo`` (``algorithm.advantage=gigpo``: a TextWorld
session's ``state_key`` is the rendered view, so a group's trajectories start turns from identical states)
and ``tree_grpo`` (``algorithm.advantage=tree_grpo``, ``rollout.tree={width: 4, depth: 1, turn: 1}``: the
8 samples of a game are 2 trees of 4 leaves sharing their first turn). The flat arms run 6 steps, the
tree arm 8 (a step of it generates about a fifth fewer tokens: of a trajectory's 4–5 turns of about 2
tokens, a tree's first is shared by 4 leaves and counted once; as benchmarks/credit.py's ``--tree-steps``,
so that its run covers the flat arms' tokens: the curves are compared on tokens, each arm's within its
own shortest run); held-out every 2 steps. Every run also prints how often anchor states recur: the share of training
turns whose state (an ``env:`` key of ``turn_states``, recorded by ``gigpo`` runs only: the other arms'
are not counted) another trajectory of the same group also started a turn from, and the same past the
first turn (the opening view is every group's shared start); the turn-level part of the advantages it trained
on (:func:`turn_spread`: how far a turn's advantage sits from the mean of its trajectory's turns, against the
advantages' size, and how many turns it pushes the other way from their trajectory; 0 for grpo, which credits
every turn alike); and for the tree arm the trees whose leaves scored differently (:func:`split_trees`:
tree_grpo's credit within a tree needs them). ``--rollouts DIR ...`` prints these for runs' kept ``rollouts/``
folders, running nothing. Target: the level every ``grpo`` seed
reaches (``seed_target``: the lowest of its seeds' best held-out wins within its shortest run). Last lines:
``tokens to target, gigpo/grpo: …``, ``tokens to target, tree_grpo/grpo: …``, the better of the two by
point estimate named, and

    tokens to target, gigpo or tree_grpo / grpo: X.XX [lo, hi]

``--claim curriculum`` (:data:`CURRICULUM`): rooms 3, objects 3, ``max_steps`` 8, four levels of quest
length (``env_options.levels={quest_length: [1, 2, 3, 4]}``), 4 training games and 8 held-out a level
(32 held-out; few training games, so that in 6 steps of 4 a game comes back, 1.5 epochs, and its pass rate
means something: with one epoch or less ``pass_rate`` draws what ``uniform`` draws). Arms ``uniform``
(``data.curriculum={name: uniform}``), ``pass_rate`` (``{name: pass_rate, shares: {normal: 1.0}, revisit:
0.1, window: 2}``) and ``env_difficulty`` (``{name: env_difficulty, window: 8, up: 0.6, down: 0.1}``: a
level move every 2 steps at most), 6 steps each, held-out every 3 steps. Held-out wins are printed per level, and
on a line of its own per arm its wins on the hardest level (quest length 4); every run also prints the games
each step trained on by level (:func:`levels_trained`; ``--rollouts DIR ... --claim curriculum`` for kept runs).
Target: the level every ``uniform`` seed reaches. Last line

    tokens to target, curriculum/uniform: X.XX [lo, hi]

(curriculum: the better of ``pass_rate`` and ``env_difficulty`` by point estimate).

Both: generated tokens are the model's tokens (``response_mask`` 1) of every trajectory of
``rollouts/step_NNNNN.jsonl``, a tree's shared prefix (before its leaves' ``split_point``) once. Each seed's
curve is (tokens, held-out plays won), linear between its evaluations; an arm's curve is the seed mean; its
tokens to target are where that curve first reaches the target, and each ratio to the base arm's comes with
a 90% interval over 2,000 seed bootstraps (_common.ratio_to_target; ``n/a``: a seed mean never reached it).
Runs go ``--jobs`` at a time, each a single-threaded process of its own.

Wall time of the defaults (2 cores, ``--jobs 2``; :func:`estimate`, printed before any run): from the credit
claim's first runs, 28 s a game a training step, 1.35 s a held-out play, 15 s to start a run: ``credit`` about
2.1 h (a flat run ~880 s, as measured; a tree run ~1,170 s, 999 s measured); ``curriculum`` about 2.9 h with
its games 1.6 times as costly (8 turns at most against 5, 3 rooms and 3 objects: longer views; a worked game of
1 command against 2), as its first runs measured (1,353-1,381 s a run, two at once, 136-179 s a step).
Each run prints its peak memory, and two at once must fit: the smoke run's peaked at 7.8 GiB (2 games a
step), while a ``toolrl train`` of the example's own settings (4 games) reached 14.7 GB resident on a 24 GB
machine. Where two do not fit: ``--micro-batch 4`` (if training's activations are the peak; the gradient is
the same), or ``--jobs 1`` with the seeds split over sessions (``--first-seed``, ``--logs``).

    OMP_NUM_THREADS=1 python benchmarks/textworld_claims.py --claim credit|curriculum [--quick] [--seeds 5]
        [--first-seed 0] [--steps N] [--tree-steps N] [--eval-every N] [--train N] [--held-out N]
        [--micro-batch N] [--jobs 2] [--arms a,b] [--logs OUTPUT ...]

``--first-seed`` and ``--logs`` split the seeds over several runs: each run's output kept, ``--logs`` prints the
figures of all their per-seed lines together, running nothing (and importing neither toolrl nor the plugin);
``--targets 26,28`` adds each arm's tokens to those levels and the ratios there, before the protocol's target and
last line (how the figure moves with the target: read beside it, never in its place).
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import (
    machine,
    report_curves,
    report_other_targets,
    report_ratios,
    run_child,
    single_thread,
    table,
)

single_thread()

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "textworld.yaml"
# The wall-time estimate's figures, from the credit claim's first runs (two at a time, quiet 2 cores: a flat run
# 840-879 s, 106-112 s a step of 4 games, three evaluations of 48 plays in the rest): 28 s a game a step, 1.35 s
# a held-out play, 15 s to start a run. Claims with longer games cost ``slower`` times that.
GAME_STEP_S, HELD_OUT_PLAY_S, START_S = 28.0, 1.35, 15.0
PLAYS = 2  # each held-out game's plays an evaluation


@dataclass(frozen=True)
class Claim:
    """A fixed protocol: the games, the arms and their overrides, the defaults, which arm is the base."""

    games: str  # env_options but the split sizes and the seed (always 0: the same games for every arm)
    levels: tuple[str, ...]  # each level's name (one level: the whole split)
    arms: dict[str, list[str]]
    base: str
    contenders: tuple[str, ...]  # the last line's arm is the better of these by point estimate
    last: str  # the last line's name
    steps: int
    train: int  # training games a level
    held_out: int  # held-out games a level
    eval_every: int = 2
    tree_steps: int = 0  # the tree arm's steps (0: no tree arm)
    slower: float = 1.0  # its games' cost against the smoke run's (the estimate)


CREDIT = Claim(
    games="kind: custom, rooms: 2, objects: 2, quest_length: 2, max_steps: 5, commands: actions",
    levels=("quest_length=2",),
    arms={"grpo": [], "gigpo": ["algorithm.advantage=gigpo"],
          "tree_grpo": ["algorithm.advantage=tree_grpo", "rollout.tree={width: 4, depth: 1, turn: 1}"]},
    base="grpo", contenders=("gigpo", "tree_grpo"), last="gigpo or tree_grpo / grpo",
    steps=6, tree_steps=8, train=64, held_out=24)
QUESTS = (1, 2, 3, 4)
CURRICULUM = Claim(
    games=f"kind: custom, rooms: 3, objects: 3, levels: {{quest_length: {list(QUESTS)}}}, max_steps: 8, commands: actions",
    levels=tuple(f"quest_length={q}" for q in QUESTS),
    arms={"uniform": ["data.curriculum={name: uniform}"],
          "pass_rate": ["data.curriculum={name: pass_rate, shares: {normal: 1.0}, revisit: 0.1, window: 2}"],
          "env_difficulty": ["data.curriculum={name: env_difficulty, window: 8, up: 0.6, down: 0.1}"]},
    base="uniform", contenders=("pass_rate", "env_difficulty"), last="curriculum/uniform",
    steps=6, eval_every=3, train=4, held_out=8, slower=1.6)
CLAIMS = {"credit": CREDIT, "curriculum": CURRICULUM}


def settings(out: Path, seed: int, args: argparse.Namespace, *extra: str) -> list[str]:
    """The claim's task (module docstring) for a run into ``out``."""
    claim = CLAIMS[args.claim]
    return [f"env_options={{{claim.games}, train_size: {args.train}, test_size: {args.held_out}, seed: 0}}",
            f"eval.num_samples={args.held_out * len(claim.levels)}", f"eval.n={PLAYS}", "eval.temperature=1.0",
            f"trainer.output_dir={out}",
            f"trainer.seed={seed}", f"rollout.seed={seed}", f"trainer.total_steps={args.steps}",
            f"trainer.eval_every={args.eval_every}", "trainer.save_every=100000", "trainer.plot=false",
            "trainer.progress=false", f"data.batch_size={args.batch}",
            *([f"optim.micro_batch_size={args.micro_batch}"] if args.micro_batch else []), *extra]


def arm_overrides(arm: str, args: argparse.Namespace) -> list[str]:
    steps = [f"trainer.total_steps={args.tree_steps}"] if arm == "tree_grpo" else []
    return [*CLAIMS[args.claim].arms[arm], *steps]


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").split("\n") if x.strip()]


def by_level(rows: Sequence[dict[str, Any]], held_out: int, levels: int) -> list[int]:
    """Held-out plays won per level: the plugin's test split holds its games level by level, ``held_out``
    a level, indexed in that order (no held-out game is dropped), so a game's level is its index // held_out."""
    won = [0] * levels
    for r in rows:
        won[r["problem"] // held_out] += r["reward_terms"].get("textworld") == 1.0
    return won


def generated_tokens(rows: Sequence[dict[str, Any]]) -> int:
    """The model tokens a step generated: every trajectory's, a tree's shared prefix once (one split per
    tree: the leaves that split share the tokens before their ``split_point``; benchmarks/credit.py)."""
    total, counted = 0, set()
    for r in rows:
        mask, cut = r["response_mask"], r.get("split_point") or 0
        total += sum(mask[cut:])
        if cut and (r["group"], r["tree_id"]) not in counted:
            counted.add((r["group"], r["tree_id"]))
            total += sum(mask[:cut])
    return total


def anchors(rows: Sequence[dict[str, Any]]) -> list[int]:
    """How often anchor states recur: training turns started from an ``env:`` state (gigpo records them;
    other arms key turns by the observation, not counted) that another trajectory of the group also started
    a turn from, and all such turns; then the same past each trajectory's first turn."""
    starts: dict[tuple[int, str], set[str]] = {}
    turns: list[tuple[tuple[int, str], bool]] = []  # each counted turn's (group, state), and whether it is a first
    for r in rows:
        for i, state in enumerate(r.get("turn_states") or []):
            if state.startswith("env:"):
                starts.setdefault((r["group"], state), set()).add(r.get("trajectory_key") or r["trajectory_id"])
                turns.append(((r["group"], state), i == 0 and not r.get("piece")))
    tally = [0, 0, 0, 0]
    for key, first in turns:  # the opening view is every group's shared first state: past it, counted apart
        recur = len(starts[key]) > 1
        tally[0], tally[1] = tally[0] + recur, tally[1] + 1
        if not first:
            tally[2], tally[3] = tally[2] + recur, tally[3] + 1
    return tally


def turn_spread(rows: Sequence[dict[str, Any]]) -> list[float]:
    """What turn-level credit adds to the advantages trained on: over every row's turns (each turn's first trained
    token), the sum of |a - the mean a of the row's turns|, the sum of |a|, the turns, and the turns whose a has the
    other sign than that mean (credit that reverses a turn's push, not only scales it). An outcome estimator (grpo)
    gives each turn its trajectory's advantage, so the first and the last are 0. A row whose advantage is one number
    (a tree's leaf: :func:`split_trees` tells its credit) is not counted."""
    spread = [0.0, 0.0, 0, 0]
    for r in rows:
        mask, adv, starts = r["response_mask"], r["advantage"], r.get("turn_starts") or [0]
        if not isinstance(adv, list):
            continue
        ends = [*starts[1:], len(mask)]
        firsts = [next((k for k in range(s, e) if mask[k]), None) for s, e in zip(starts, ends, strict=True)]
        turns = [adv[k] for k in firsts if k is not None]
        if turns:
            mean = statistics.fmean(turns)
            spread[0] += sum(abs(a - mean) for a in turns)
            spread[1] += sum(abs(a) for a in turns)
            spread[2] += len(turns)
            spread[3] += sum(a * mean < 0 for a in turns)
    return spread


def split_trees(rows: Sequence[dict[str, Any]]) -> list[int]:
    """What a tree's credit has to work with: the trees (a ``tree_id``'s leaves of one group) whose leaves' rewards
    differ, and all trees; then the same for the groups. A tree whose leaves all scored alike gives its branch turns
    nothing beyond the group's outcome advantage."""
    trees: dict[tuple[int, int], set[float]] = {}
    groups: dict[int, set[float]] = {}
    for r in rows:
        if r.get("tree_id") is not None:
            trees.setdefault((r["group"], r["tree_id"]), set()).add(r["reward"])
            groups.setdefault(r["group"], set()).add(r["reward"])
    return [sum(len(v) > 1 for v in trees.values()), len(trees), sum(len(v) > 1 for v in groups.values()), len(groups)]


def levels_trained(rows: Sequence[dict[str, Any]], level_of: Mapping[int, int], levels: int) -> list[int]:
    """The games a step trained on, by level: ``level_of`` holds each training game's level by its sample index
    (:func:`training_levels`; the plugin drops a training game that is also a held-out one, so an index alone
    does not say its level)."""
    counts = [0] * levels
    for _, index in {(r["group"], r["sample_index"]) for r in rows}:
        counts[level_of[index]] += 1
    return counts


def training_levels(args: argparse.Namespace) -> dict[int, int]:
    """Each game of the claim's training split (generated once, then cached): its level by its sample index."""
    from toolrl.config import load_config
    from toolrl.data.sources import load_samples

    config = load_config(EXAMPLE, settings(Path("unused"), 0, args))
    return {s.index: s.level or 0 for s in load_samples(config, "train")}


def rollout_figures(steps: Iterable[Sequence[dict[str, Any]]], level_of: Mapping[int, int] | None = None,
                    levels: int = 1) -> dict[str, Any]:
    """A run's anchor tally (:func:`anchors`), :func:`turn_spread` and :func:`split_trees` over its steps' rollout
    rows (a ``rollouts/`` folder's ``step_NNNNN.jsonl`` files), and with several ``levels`` each step's
    :func:`levels_trained`."""
    tally, spread, split, drawn = [0, 0, 0, 0], [0.0, 0.0, 0, 0], [0, 0, 0, 0], []
    for rows in steps:
        tally = [a + b for a, b in zip(tally, anchors(rows), strict=True)]
        spread = [a + b for a, b in zip(spread, turn_spread(rows), strict=True)]
        split = [a + b for a, b in zip(split, split_trees(rows), strict=True)]
        if level_of is not None and levels > 1:
            drawn.append(levels_trained(rows, level_of, levels))
    return {"anchors": tally, "turn_spread": spread, "trees": split, "levels_trained": drawn}


def child(args: argparse.Namespace) -> int:
    """One run (``--child ARM SEED OUT``, or ``before`` for the untrained model's evaluation); its figures
    as one JSON line."""
    from toolrl.config import load_config

    arm, seed, out = args.child[0], int(args.child[1]), Path(args.child[2])
    levels = len(CLAIMS[args.claim].levels)
    if arm == "before":
        from toolrl.data.sources import load_samples
        from toolrl.processes.evaluate import run_evaluation

        config = load_config(EXAMPLE, settings(out / "run", seed, args))
        load_samples(config, "train")  # the training games generated (cached) now, not by parallel runs at once
        run_evaluation(config, out, progress=False)
        print(json.dumps({"by_level": by_level(lines(out / "results.jsonl"), args.held_out, levels)}))
        return 0
    import asyncio

    from toolrl.processes.controller import train_async

    t0 = time.perf_counter()
    asyncio.run(train_async(load_config(EXAMPLE, settings(out, seed, args, *arm_overrides(arm, args)))))
    points, tokens, step_s, figures, steps = [], 0, [], [], []
    for row in lines(out / "metrics.jsonl"):
        step = row["step"]
        steps.append(lines(out / "rollouts" / f"step_{step:05d}.jsonl"))
        tokens += generated_tokens(steps[-1])
        step_s.append(row["step_s"])
        figures.append(row.get("curriculum", {}))
        if (out / "eval" / f"step_{step:05d}.jsonl").exists():
            won = by_level(lines(out / "eval" / f"step_{step:05d}.jsonl"), args.held_out, levels)
            points.append({"step": step, "tokens": tokens, "by_level": won})
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # GiB (Linux: KiB): what --jobs must fit
    print(json.dumps({"points": points, "wall_s": time.perf_counter() - t0, "step_s": statistics.mean(step_s),
                      "peak_gib": peak, "curriculum": figures,
                      **rollout_figures(steps, training_levels(args) if levels > 1 else None, levels)}))
    return 0


def figures_line(got: dict[str, Any]) -> str:
    """A run's extra figures: anchor recurrence (gigpo), the curriculum's zero-variance share and levels."""
    parts = []
    if got["anchors"][1]:
        a = got["anchors"]
        parts.append(f"anchor states recur {a[0]}/{a[1]} turns (past the first turn {a[2]}/{a[3]})")
    if got.get("turn_spread", [0, 0, 0, 0])[2]:
        d, m, n, flipped = got["turn_spread"]
        parts.append(f"turn-level part of the advantage: mean |a - its trajectory's| {d / n:.3f} against mean |a| "
                     f"{m / n:.3f} over {n} turns, {flipped} of the other sign")
    if got.get("trees", [0, 0])[1]:
        t = got["trees"]
        parts.append(f"trees whose leaves scored differently {t[0]}/{t[1]} (groups {t[2]}/{t[3]})")
    if got.get("levels_trained"):
        parts.append("games trained by level a step " + " ".join("/".join(map(str, c)) for c in got["levels_trained"]))
    figures = [f for f in got["curriculum"] if f]
    if figures:
        parts.append("zero-variance share " + " ".join(f"{f.get('zero_variance', float('nan')):.2f}" for f in figures))
        if all("level" in f for f in figures):
            parts.append("level " + " ".join(str(next(iter(f["level"].values()), "-")) for f in figures))
        if any("avoided" in f for f in figures):
            parts.append("avoided " + " ".join(f"{f.get('avoided', 0.0):.2f}" for f in figures))
    return "; ".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--claim", choices=list(CLAIMS), help="which protocol (module docstring); --logs reads it")
    ap.add_argument("--quick", action="store_true", help="1 seed, 2 steps of 2 games, 4 held-out games (1 a level "
                    "under curriculum), held-out every step: a smoke run")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--first-seed", type=int, default=0, help="the seeds run are first-seed, first-seed + 1, ...")
    ap.add_argument("--logs", nargs="+", type=Path, help="no runs: the figures of the per-seed lines these earlier "
                                                          "outputs of this script printed (seeds split over runs)")
    ap.add_argument("--targets", type=lambda v: [float(x) for x in v.split(",")], default=[],
                    help="with --logs: also each arm's tokens to these held-out levels and the ratios there "
                         "(comma-separated): how the figure moves with the target, beside the protocol's")
    ap.add_argument("--rollouts", nargs="+", type=Path, help="no runs: the anchor tally, the turn-level part of "
                    "the advantage and the trees' figures of these runs' rollouts/ folders (with --claim curriculum "
                    "also the games each step trained on by level)")
    ap.add_argument("--steps", type=int, help="steps of each run (default: the claim's; the tree arm: --tree-steps)")
    ap.add_argument("--tree-steps", type=int, help="steps of the tree arm (default: the claim's)")
    ap.add_argument("--eval-every", type=int, help="held-out evaluation every this many steps (default: the claim's)")
    ap.add_argument("--batch", type=int, default=4, help="games a step (8 samples each)")
    ap.add_argument("--train", type=int, help="training games a level (default: the claim's)")
    ap.add_argument("--held-out", type=int, help="held-out games a level (default: the claim's)")
    ap.add_argument("--micro-batch", type=int, help="optim.micro_batch_size (default: the example's 8): fewer "
                    "sequences a micro-batch, less peak memory, the same gradient (token-mean over the step's batch)")
    ap.add_argument("--arms", help="the arms to run (comma-separated; default: the claim's)")
    ap.add_argument("--jobs", type=int, default=2, help="runs at once, each single-threaded")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.logs:
        claim, curves, held_out = from_logs(args.logs)
        return report(claim, curves, held_out, f"{max(map(len, curves.values()))} seeds, from "
                      + ", ".join(map(str, args.logs)), args.targets)
    for key in ("steps", "tree_steps", "eval_every", "train", "held_out"):
        if args.claim and getattr(args, key) is None:
            setattr(args, key, getattr(CLAIMS[args.claim], key))
    if args.rollouts:
        levels = len(CLAIMS[args.claim].levels) if args.claim else 1
        level_of = training_levels(args) if levels > 1 else None
        for folder in args.rollouts:
            steps = map(lines, sorted(folder.glob("step_*.jsonl")))
            print(f"{folder}: {figures_line({'curriculum': [], **rollout_figures(steps, level_of, levels)})}")
        return 0
    if args.claim is None:
        ap.error("--claim credit|curriculum is needed (but with --logs)")
    claim = CLAIMS[args.claim]
    if args.quick:
        args.seeds, args.steps, args.tree_steps, args.batch, args.eval_every = 1, 2, 2, 2, 1
        args.held_out, args.train = (4, 8) if len(claim.levels) == 1 else (1, 4)
    if args.child:
        return child(args)
    return run_all(args)


def run_all(args: argparse.Namespace) -> int:
    """The untrained evaluation, then every arm and seed, ``--jobs`` at a time; the report."""
    claim = CLAIMS[args.claim]
    arms = [a for a in (args.arms or ",".join(claim.arms)).split(",") if a]
    unknown = [a for a in arms if a not in claim.arms]
    if unknown:
        raise SystemExit(f"--arms: {unknown[0]} is not an arm of --claim {args.claim} ({', '.join(claim.arms)})")
    common = [f"--claim={args.claim}", *(f"--{k.replace('_', '-')}={getattr(args, k)}"
                                         for k in ("steps", "tree_steps", "eval_every", "batch", "train", "held_out",
                                                   "micro_batch") if getattr(args, k) is not None)]
    levels = len(claim.levels)
    print(f"machine: {machine()}")
    print(f"claim: {args.claim}")
    print(f"workload: SmolLM2-135M-Instruct (LoRA r16), TextWorld {claim.games}, levels {', '.join(claim.levels)}; "
          f"{args.train} training games and {args.held_out} held-out a level (env seed 0; {PLAYS} plays a game at "
          f"temperature 1, every {args.eval_every} steps); {args.steps} steps × {args.batch} games × 8 samples"
          f"{f' (tree_grpo: {args.tree_steps} steps)' if 'tree_grpo' in arms else ''}; arms {', '.join(arms)}; "
          f"seeds {args.first_seed}-{args.first_seed + args.seeds - 1}; {args.jobs} runs at once; estimated "
          f"{estimate(args, arms) / 3600:.1f} h\n", flush=True)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="textworld-") as tmp:
        base = Path(tmp)
        before = run_child(__file__, ["--child", "before", "0", str(base / "before"), *common], "before")["by_level"]
        plays = args.held_out * PLAYS  # a level's: the figures below count plays won
        print(f"untrained: {sum(before)}/{plays * levels} held-out won ({'/'.join(map(str, before))} by level)"
              f", {plays} a level; {time.perf_counter() - t0:.0f} s", flush=True)
        seeds = range(args.first_seed, args.first_seed + args.seeds)
        jobs = [(arm, seed) for seed in seeds for arm in arms]

        def one(job: tuple[str, int]) -> dict[str, Any]:
            arm, seed = job
            got = run_child(__file__, ["--child", arm, str(seed), str(base / f"{arm}-{seed}"), *common], f"{arm} seed {seed}")
            print(f"{arm} seed {seed}: {got['wall_s']:.0f} s, {got['step_s']:.0f} s a step, peak {got['peak_gib']:.1f} "
                  "GiB; held-out won at tokens "
                  "(by level): " + " ".join(f"{sum(p['by_level'])}@{p['tokens']}({'/'.join(map(str, p['by_level']))})"
                                            for p in got["points"]) + f"; {figures_line(got)}", flush=True)
            return got

        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            results = dict(zip(jobs, pool.map(one, jobs), strict=True))
    curves = {arm: [Run([(0.0, before), *((float(p["tokens"]), p["by_level"]) for p in results[(arm, s)]["points"])],
                        results[(arm, s)]["anchors"], results[(arm, s)]["turn_spread"]) for s in seeds] for arm in arms}
    return report(args.claim, curves, args.held_out * PLAYS, f"{args.seeds} seeds; {time.perf_counter() - t0:.0f} s in all")


def estimate(args: argparse.Namespace, arms: Sequence[str]) -> float:
    """Seconds the runs should take, ``--jobs`` at a time, from the smoke run's figures (``GAME_STEP_S``...)."""
    claim = CLAIMS[args.claim]
    plays = args.held_out * len(claim.levels) * PLAYS

    def run(steps: int) -> float:
        return START_S + claim.slower * (steps * args.batch * GAME_STEP_S + steps // args.eval_every * plays * HELD_OUT_PLAY_S)

    runs = args.seeds * sum(run(args.tree_steps if arm == "tree_grpo" else args.steps) for arm in arms)
    return START_S + claim.slower * plays * HELD_OUT_PLAY_S + runs / args.jobs


@dataclass
class Run:
    """One seed's run: (tokens, held-out plays won by level) at each evaluation, the untrained first; its
    anchor tally (:func:`anchors`) and turn spread (:func:`turn_spread`; zeros where its log has none)."""

    points: list[tuple[float, list[int]]]
    anchors: list[int]
    spread: list[float]

    def curve(self) -> list[tuple[float, float]]:
        return [(t, float(sum(won))) for t, won in self.points]


Curves = dict[str, list[Run]]


def from_logs(paths: Sequence[Path]) -> tuple[str, Curves, int]:
    """The claim, each arm's runs and the held-out plays a level, from the lines earlier outputs of this
    script printed (the claim line, the untrained line and the per-seed lines)."""
    claim, before, per_level, runs = None, None, 0, {}
    for path in paths:
        for line in path.read_text(encoding="utf-8").splitlines():
            if m := re.match(r"claim: (\w+)$", line):
                if claim not in (None, m.group(1)):
                    raise SystemExit(f"--logs: outputs of two claims ({claim}, {m.group(1)})")
                claim = m.group(1)
            elif m := re.match(r"untrained: \d+/\d+ held-out won \(([\d/]+) by level\), (\d+) a level", line):
                before, per_level = [int(x) for x in m.group(1).split("/")], int(m.group(2))
            elif m := re.match(r"(\w+) seed (\d+): \d+ s, \d+ s a step(?:, peak [\d.]+ GiB)?; held-out won at tokens "
                               r"\(by level\): (.*?);(.*)", line):
                points = [(float(t), [int(x) for x in won.split("/")])
                          for t, won in re.findall(r"\d+@(\d+)\(([\d/]+)\)", m.group(3))]
                got = re.search(r"recur (\d+)/(\d+) turns \(past the first turn (\d+)/(\d+)\)", m.group(4))
                spread = re.search(r"trajectory's\| ([\d.]+) against mean \|a\| ([\d.]+) over (\d+) turns, (\d+) of",
                                   m.group(4))
                runs[(m.group(1), int(m.group(2)))] = (
                    points, [int(x) for x in got.groups()] if got else [0] * 4,
                    [float(spread[1]) * int(spread[3]), float(spread[2]) * int(spread[3]), int(spread[3]),
                     int(spread[4])] if spread else [0.0, 0.0, 0, 0])
    if claim not in CLAIMS or before is None or not runs:
        raise SystemExit(f"--logs: no claim line, untrained line or per-seed line in {', '.join(map(str, paths))}")
    return claim, {arm: [Run([(0.0, before), *runs[key][0]], *runs[key][1:]) for key in sorted(runs) if key[0] == arm]
                   for arm in CLAIMS[claim].arms if any(key[0] == arm for key in runs)}, per_level


def report(name: str, curves: Curves, per_level: int, seeds: str, targets: Sequence[float] = ()) -> int:
    """The arms' mean curves and every seed's, wins by level (``per_level``: held-out plays a level), anchor
    recurrence, the ratios at other ``targets`` where asked, the target (module docstring) and each arm's tokens
    to it, each arm's ratio to the base arm's and the last line."""
    claim = CLAIMS[name]
    plays = per_level * len(claim.levels)
    ends = report_curves({arm: [r.curve() for r in rs] for arm, rs in curves.items()}, "held-out plays won",
                         plays, seeds)
    levels_report(claim, curves, per_level)
    for arm, rs in curves.items():
        a = [sum(col) for col in zip(*(r.anchors for r in rs))]
        if a[1]:
            print(f"{arm}: anchor states recur for {a[0] / a[1]:.0%} of {a[1]} training turns (another trajectory of "
                  f"the group started a turn from the same state); past the first turn {a[2] / max(a[3], 1):.0%} of {a[3]}")
        d, m, n, flipped = (sum(col) for col in zip(*(r.spread for r in rs)))
        if n:
            print(f"{arm}: turn-level part of the advantage (seeds with the figure): mean |a - its trajectory's| "
                  f"{d / n:.3f} against mean |a| {m / n:.3f} over {n:.0f} turns, {flipped / n:.1%} of the other sign")
    if claim.base in curves and targets:
        report_other_targets({arm: [r.curve() for r in rs] for arm, rs in curves.items()}, ends, claim.base, targets,
                             f"held-out plays won of {plays}")
    if claim.base in curves:
        report_ratios({arm: [r.curve() for r in rs] for arm, rs in curves.items()}, ends, claim.base,
                      claim.contenders, claim.last, f"{plays} held-out won")
    return 0


def levels_report(claim: Claim, curves: Curves, per_level: int) -> None:
    """Held-out wins by level, untrained and at each run's last evaluation (seed mean); with levels, a line
    per arm of its wins on the hardest."""
    if len(claim.levels) < 2:
        return
    before = next(iter(curves.values()))[0].points[0][1]
    last = {arm: [statistics.mean(col) for col in zip(*(r.points[-1][1] for r in rs))] for arm, rs in curves.items()}
    print(f"\nheld-out plays won by level, of {per_level} each (seed mean at each run's last evaluation)")
    print(table(["arm", *claim.levels], [["untrained", *before], *([arm, *(f"{v:.1f}" for v in won)]
                                                                   for arm, won in last.items())]))
    hardest = claim.levels[-1]
    for arm, rs in curves.items():
        print(f"{arm}: hardest level ({hardest}) held-out won {last[arm][-1]:.1f}/{per_level} at the end (per seed "
              + " ".join(str(r.points[-1][1][-1]) for r in rs) + f"; untrained {before[-1]}; best on the way "
              + " ".join(str(max(won[-1] for _, won in r.points)) for r in rs) + ")")



if __name__ == "__main__":
    sys.exit(main())
