"""On-policy distillation against GRPO: held-out success against generated tokens, a fresh student
taught by a teacher that solves the task (``algorithm.advantage: opd``) or trained on the reward alone.

The real training loop (``toolrl.processes.controller.train_async``, what ``toolrl train`` runs, in one
process) trains the tiny random Qwen3 with its embeddings scaled up (peaked next-token distributions, as
``tests/test_trainer.py``'s ``peaked_tiny_model``) on the aligned-token task of
``tests/test_trainer.py::test_grpo_learns_a_learnable_task``: the reward is the share of the response's
tokens whose initial embedding points to the positive side of one direction (half the vocabulary).
Prompts are the arithmetic environment's; a held-out trajectory succeeds when at least
``--threshold`` of its tokens are aligned.

1. The teacher: the same initial model trained on the reward (``--teacher``: ``--teacher-steps``, 80,
   steps of ``dr_grpo`` as a LoRA of rank 16 at lr 1e-1: 52.4/64 on 1,024 held-out trajectories), exported
   (the adapter merged). A LoRA of the students' rank, so a student can become its teacher exactly: from a
   teacher that trained every weight (40 steps of ``grpo`` at lr 5e-3, the earlier default: 55.2/64) the
   LoRA student levels a little under it (50 against 55) with its KL to it stuck at 0.02-0.04; from this
   one its KL falls to 0.00-0.01 and it levels at its teacher's success. A teacher trained hard on every
   weight (``dr_grpo`` at 5e-2, 64/64) collapses onto a few tokens, to which the student, sampling from
   ~150k, gives mass ~e^-11; every token it samples then has a teacher log-prob near -25, every advantage
   is about -14, aligned or not (measured: 0 of 192 positive), and distillation has no direction to follow.
2. Each arm from the initial model, ``--seeds`` seeds: ``opd`` (pure distillation, ``reward_weight``
   0: the reward is never read) and ``grpo`` (``--grpo``: ``dr_grpo``, the fastest reward-only pair of
   the matrix), both a LoRA of rank 16 at lr 5e-2 (GRPO's best: 49.0/64 after 48 steps, 3 seeds; 48.3 at
   1e-1; one seed at 2e-1, 43). LoRA, as the field
   distils (the Tinker API trains LoRA only): with every weight trained, the output head's rows of the
   tokens the student never samples drift under AdamW (opd's advantages are mostly negative), and the
   student falls after passing its teacher while its KL to it grows (docs/benchmarks.md; ``toolrl train``
   warns of it). Every ``--eval-every`` steps the held-out split is sampled (16
   problems × 4 samples at temperature 1 = 64 trajectories).
   ``--grpo-reward success``: the grpo arm's reward is the held-out criterion itself (1 at ``--threshold``
   aligned or more, else 0), as a verifier's, instead of the aligned share.

Generated tokens are the trained tokens (``response_mask`` 1) of every step's trajectories. Tokens to
90% of the teacher's success: where the seed-mean curve (linear between evaluations, the untrained
model's success at 0 tokens) first reaches 0.9 × the teacher's held-out success.

    OMP_NUM_THREADS=1 python benchmarks/distill.py [--quick] [--seeds 3] [--steps 64]

Last line: ``tokens to 90% of the teacher's success, opd/grpo: X.XX`` (below 1: OPD needs fewer tokens; ``< X.XX``
when GRPO's run ends first: a bound, opd's tokens over all of GRPO's).
With ``--vopd`` the arms are opd with vOPD's baseline (``advantage_options: {top_k: 20, baseline: vopd}``)
and plain opd: ``..., vopd/opd: X.XX``.

``--gemma`` runs only the issue's pair across tokenizers: Gemma 3 270M, prompted, teaches
SmolLM2-135M-Instruct the quickstart's calculator task (``opd``, ``reward_weight`` 0), beside GRPO alone on
the reward; held-out success (64 problems, greedy) every ``--eval-every`` (4) steps of each arm. Last
lines: ``cross-tokenizer: before A/64 → after B/64 (min over steps C/64)`` and ``cross-tokenizer tokens to
B/64, opd/grpo: X.XX`` (the trained tokens each arm took to first reach the opd arm's final success).

``--overlap`` measures only where the teacher's time goes (``teacher_s`` against ``teacher_wait_s``: what
of it the steps still waited for), the teacher scoring each group as it is generated.

``--across`` runs only a teacher of another tokenizer: SmolLM2-135M-Instruct, as it comes, distils
into the peaked tiny Qwen3 (``reward_weight`` 0) on a task an English model's log-probs favour: the
share of the response's characters that are ASCII letters or spaces (success: at least
``--threshold``). The teacher scores the student's text through the character alignment
(docs/distillation.md), its prompt rendered by its own template. Last line:
``cross-tokenizer: before N/64 → after M/64``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from _common import machine, mean_curve, single_thread, table, tokens_to

single_thread()

from toolrl.config import load_config  # noqa: E402
from toolrl.plugins import get_plugins  # noqa: E402
from toolrl.plugins.registry import Part  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EVAL = 64  # held-out trajectories per evaluation: 16 problems × 4 samples
PROBLEMS = 16  # the held-out problems of the aligned-token task
TEACHER_SAMPLES = 64  # samples a problem for the teacher's success, the target's base (1,024 trajectories)


class AlignedTokens:
    """The share of the response's tokens whose initial embedding is aligned (module docstring)."""

    name = "aligned_tokens"
    good: ClassVar[Any] = None

    def __call__(self, response: str, ground_truth: Any, **info: Any) -> float:
        ids = info["response_ids"]
        return sum(bool(self.good[t]) for t in ids) / max(len(ids), 1)


class AlignedSuccess:
    """The held-out criterion as a reward: 1 when at least ``threshold`` of the response's tokens are aligned,
    else 0 (``--grpo-reward success``: the task's outcome, as a verifier gives it)."""

    name = "aligned_success"
    threshold: ClassVar[float] = 0.75

    def __call__(self, response: str, ground_truth: Any, **info: Any) -> float:
        return float(AlignedTokens()(response, ground_truth, **info) >= self.threshold)


class EnglishLetters:
    """The share of the response's characters that are ASCII letters or spaces (``--across``'s task: text
    an English teacher of another tokenizer likes, which a random student writes little of)."""

    name = "english_letters"

    def __call__(self, response: str, ground_truth: Any, **info: Any) -> float:
        return sum(c.isascii() and (c.isalpha() or c == " ") for c in response) / max(len(response), 1)


def register() -> None:
    registry = get_plugins().registry
    for part in (AlignedTokens, AlignedSuccess, EnglishLetters):
        if not registry.has("reward_functions", part.name):
            registry.add(Part("reward_functions", part.name, "benchmark", part))


def across(args: argparse.Namespace) -> int:
    """A teacher of another tokenizer: SmolLM2-135M-Instruct (untrained) distils into the peaked tiny Qwen3
    (``reward_weight`` 0), held-out success (``EnglishLetters`` at least ``--threshold``) before and after."""
    from toolrl.model_sources import smollm2_135m

    smollm2_135m()
    task = ["reward.functions=[{name: english_letters}]", "eval.metric=english_letters"]
    with tempfile.TemporaryDirectory(prefix="distill-across-") as tmp:
        base = Path(tmp)
        model = peaked_model(base / "model")
        from toolrl.processes.evaluate import run_evaluation
        from toolrl.training.export import export

        def success(source: Path, out: Path) -> int:
            config = load_config(ROOT / "examples" / "tiny.yaml", settings(source, out / "run", 0, args, *task))
            return round(run_evaluation(config, out, progress=False)["pass@1"] * EVAL)

        before = success(model, base / "before")
        t0 = time.perf_counter()
        train(model, base / "run", 0, args.steps, args, [*task, *shlex.split(args.opd),
                                                          "algorithm.teacher={model: smollm2-135m-instruct}"], args.steps)
        after = success(export(base / "run", base / "after-model"), base / "after")
        print(f"student tiny-qwen3 (Qwen tokenizer), teacher SmolLM2-135M-Instruct (its own); {args.steps} steps, "
              f"{time.perf_counter() - t0:.0f} s")
    print(f"cross-tokenizer: before {before}/{EVAL} → after {after}/{EVAL}")
    return 0


def gemma(args: argparse.Namespace) -> int:
    """The issue's pair across tokenizers: Gemma 3 270M (the base model, prompted by the task's worked
    example) teaches SmolLM2-135M-Instruct the quickstart's calculator task (``examples/distill.yaml``:
    ``opd``, ``reward_weight`` 0, the output head frozen, the teacher ``gemma3-270m``), ``--steps`` steps,
    beside the same student trained by GRPO alone on the reward (``examples/quickstart.yaml``). Held-out:
    the quickstart's 64 problems, greedy, for the teacher and the student before, and after every
    ``--eval-every`` steps of each arm (the run's own validation)."""
    from toolrl.processes.evaluate import run_evaluation

    with tempfile.TemporaryDirectory(prefix="distill-gemma-") as tmp:
        base = Path(args.keep or tmp)
        t0 = time.perf_counter()
        held_out = ["eval.num_samples=64", "trainer.progress=false"]
        successes = {}
        for name, source in (("teacher", "gemma3-270m"), ("before", "smollm2-135m-instruct")):
            config = load_config(ROOT / "examples" / "quickstart.yaml", [
                f"model.source={source}", f"trainer.output_dir={base / name / 'run'}", *held_out])
            successes[name] = round(run_evaluation(config, base / name, progress=False)["pass@1"] * EVAL)
        before = successes["before"]
        print(f"held-out success: teacher Gemma 3 270M {successes['teacher']}/{EVAL}, student SmolLM2-135M-Instruct "
              f"{before}/{EVAL} ({time.perf_counter() - t0:.0f} s)", flush=True)
        arms = {"opd": ("distill.yaml", ["algorithm.teacher={model: gemma3-270m}", *shlex.split(args.gemma_opd)]),
                "grpo": ("quickstart.yaml", [])}
        curves = {}
        for name, (yaml, extra) in arms.items():
            t0 = time.perf_counter()
            rows = gemma_arm(base / name, yaml, [*extra, *held_out], args)
            curve, tokens = [(0, 0, before)], 0
            for row in rows:
                tokens += int(row["trained_tokens"])
                if "val/pass@1" in row:
                    curve.append((row["step"], tokens, round(row["val/pass@1"] * EVAL)))
            curves[name] = curve
            teacher = f" (teacher {sum(r.get('teacher_s', 0.0) for r in rows):.0f} s of it)" if name == "opd" else ""
            print(f"{name}: {args.steps} steps, {time.perf_counter() - t0:.0f} s{teacher}; held-out success at "
                  "step (tokens): " + " ".join(f"{s}/{EVAL}@{step}({t})" for step, t, s in curve), flush=True)
    print(table(["step", *curves], [[step, *[next((f"{s}" for st, _, s in c if st == step), "") for c in curves.values()]]
                                    for step in sorted({st for c in curves.values() for st, _, _ in c})]))
    opd = curves["opd"]
    after, lowest = opd[-1][2], min(s for _, _, s in opd[1:])
    reached = {name: tokens_to(after, [(t, s) for _, t, s in c]) for name, c in curves.items()}
    ratio = "n/a (grpo did not reach it)" if reached["grpo"] is None else \
        f"{reached['opd'] / max(reached['grpo'], 1e-9):.2f} ({reached['opd']:.0f} against {reached['grpo']:.0f} tokens)"
    print(f"cross-tokenizer: before {before}/{EVAL} → after {after}/{EVAL} (min over steps {lowest}/{EVAL})")
    print(f"cross-tokenizer tokens to {after}/{EVAL}, opd/grpo: {ratio}")
    return 0


def gemma_arm(out: Path, yaml: str, extra: Sequence[str], args: argparse.Namespace) -> list[dict[str, Any]]:
    """One arm of ``--gemma``: ``examples/<yaml>`` for ``--steps`` steps, validated every ``--eval-every``."""
    from toolrl.processes.controller import train_async

    config = load_config(ROOT / "examples" / yaml, [
        f"trainer.output_dir={out}", f"trainer.total_steps={args.steps}", f"trainer.eval_every={args.eval_every}",
        "trainer.save_every=1000", "trainer.plot=false", *extra])
    asyncio.run(train_async(config))
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]


def overlap(args: argparse.Namespace) -> int:
    """Where the teachers' time goes: ``--steps`` steps of pure distillation, SmolLM2-135M-Instruct (another
    tokenizer, a teacher ~20× the student) scoring the peaked tiny Qwen3's groups as they are generated.
    Per step: the teachers' time (``teacher_s``) and what of it the step still waited for
    (``teacher_wait_s``: all of it when a step's batch was scored in one call after it was generated)."""
    from toolrl.model_sources import smollm2_135m

    if args.overlap_teacher == "smollm2-135m-instruct":
        smollm2_135m()
    with tempfile.TemporaryDirectory(prefix="distill-overlap-") as tmp:
        base = Path(tmp)
        model = peaked_model(base / "model")
        teacher = model if args.overlap_teacher == "student" else args.overlap_teacher
        arm = [*shlex.split(args.opd), f"algorithm.teacher={{model: {teacher}}}", f"data.batch_size={args.groups}",
               f"rollout.n={args.group_size}", f"trainer.max_staleness={args.staleness}",
               f"rollout.max_concurrent_trajectories={args.concurrency}"]
        rows = run_rows(model, base / "run", 0, args.steps, args, arm, 0)
    keys = ("rollout_wait_s", "teacher_s", "teacher_wait_s", "train_s", "step_s")
    print(f"teacher {args.overlap_teacher}; {args.steps} steps × {args.groups} groups × {args.group_size} samples × "
          f"≤ {args.max_new_tokens} tokens, {args.concurrency} at once, max_staleness {args.staleness}")
    print(table(["step", *keys], [[r["step"], *[f"{r[k]:.2f}" for k in keys]] for r in rows]))
    later = rows[1:] or rows  # the first step's also holds the teacher's first forward
    teacher, wait = sum(r["teacher_s"] for r in later), sum(r["teacher_wait_s"] for r in later)
    print(f"\nsteps 2-{args.steps}: teacher {teacher:.2f} s, of which the steps waited {wait:.2f} s; step "
          f"{statistics.mean(r['step_s'] for r in later):.2f} s mean")
    print(f"teacher time on the step's path, waited/scored: {wait / max(teacher, 1e-9):.2f}")
    return 0


def peaked_model(out: Path) -> Path:
    """The tiny random Qwen3, embeddings × 6 (``tests/test_trainer.py``'s ``peaked_tiny_model``)."""
    import shutil

    import torch
    from toolrl.model_sources import load_model, tiny_qwen3

    source = Path(tiny_qwen3())
    model = load_model(str(source))
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(6.0)
    AlignedTokens.good = model.get_input_embeddings().weight[:, 0] > 0
    model.save_pretrained(out)
    for f in source.iterdir():
        if f.name.startswith("tokenizer") or f.name.endswith(".jinja") or f.name == "special_tokens_map.json":
            shutil.copy2(f, out / f.name)
    return out


def settings(model: Path, out: Path, seed: int, args: argparse.Namespace, *extra: str) -> list[str]:
    return [f"model.source={model}", f"trainer.output_dir={out}", f"trainer.seed={seed}", f"rollout.seed={seed}",
            "trainer.plot=false", "trainer.progress=false", "trainer.save_every=1000", "data.batch_size=2",
            "rollout.n=8", "rollout.temperature=1.0", f"rollout.max_new_tokens={args.max_new_tokens}",
            f"rollout.max_response_tokens={args.max_new_tokens}", "rollout.max_turns=1", "tools.entries=[]",
            "reward.functions=[{name: aligned_tokens}]", "optim.micro_batch_size=16",
            f"env_options={{train_size: 64, test_size: {PROBLEMS}, seed: 0}}", f"eval.num_samples={PROBLEMS}", "eval.n=4",
            "eval.temperature=1.0", "eval.metric=aligned_tokens", f"eval.success_threshold={args.threshold}", *extra]


def held_out(model: Path, out: Path, args: argparse.Namespace, samples: int = 4) -> float:
    """Successes of ``model`` among the held-out split's 64 trajectories (16 problems × 4 samples); with
    more ``samples`` a problem, the same rate per 64 measured on more trajectories."""
    from toolrl.processes.evaluate import run_evaluation

    config = load_config(ROOT / "examples" / "tiny.yaml", settings(model, out / "run", 0, args, f"eval.n={samples}"))
    summary = run_evaluation(config, out, progress=False)
    return summary["pass@1"] * EVAL


def run_rows(model: Path, out: Path, seed: int, steps: int, args: argparse.Namespace, arm: Sequence[str],
             eval_every: int) -> list[dict[str, Any]]:
    """One run (``toolrl train``'s loop); its metrics rows."""
    from toolrl.processes.controller import train_async

    config = load_config(ROOT / "examples" / "tiny.yaml", settings(
        model, out, seed, args, f"trainer.total_steps={steps}", f"trainer.eval_every={eval_every}", *arm))
    asyncio.run(train_async(config))
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]


def train(model: Path, out: Path, seed: int, steps: int, args: argparse.Namespace, arm: Sequence[str],
          eval_every: int) -> list[tuple[int, int, float]]:
    """One run; (generated tokens so far, held-out successes, the step's mean advantage) at each evaluation
    (under opd the mean advantage is minus the estimate of the per-token reverse KL to the teacher)."""
    rows = run_rows(model, out, seed, steps, args, arm, eval_every)
    curve, tokens = [], 0
    for row in rows:
        tokens += int(row["trained_tokens"])
        if "val/pass@1" in row:
            curve.append((tokens, round(row["val/pass@1"] * EVAL), row["advantage_mean"]))
    return curve


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 seed, 4 steps: a smoke run")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=None, help="steps of each student run (default 64: a "
                    "collapse after the first dozen shows, and LoRA's GRPO reaches the target; --gemma, --across, "
                    "--overlap: 12)")
    ap.add_argument("--eval-every", type=int, default=None, help="held-out evaluation every this many steps "
                    "(default 2; --gemma: 4)")
    ap.add_argument("--teacher-steps", type=int, default=80)
    ap.add_argument("--max-new-tokens", type=int, default=12)
    ap.add_argument("--threshold", type=float, default=0.75, help="aligned share a held-out success needs")
    ap.add_argument("--opd", default="algorithm.advantage=opd optim.lr=5.0e-2 model.lora.r=16",
                    help="the opd arm's overrides (the teacher is added)")
    ap.add_argument("--grpo", default="algorithm.advantage=dr_grpo optim.lr=5.0e-2 model.lora.r=16",
                    help="the grpo arm's overrides")
    ap.add_argument("--grpo-reward", choices=["share", "success"], default="share",
                    help="the grpo arm's reward: the aligned share (dense) or the held-out criterion (0/1)")
    ap.add_argument("--teacher", default="algorithm.advantage=dr_grpo optim.lr=1.0e-1 model.lora.r=16",
                    help="the teacher run's overrides (from the same initial model, on the reward)")
    ap.add_argument("--across", action="store_true", help="only the cross-tokenizer run (SmolLM2 teaches the "
                    "tiny Qwen3 to write English letters)")
    ap.add_argument("--overlap", action="store_true", help="only the teachers' time against the step's: "
                    "SmolLM2 scoring groups as they are generated")
    ap.add_argument("--groups", type=int, default=8, help="--overlap: groups per step")
    ap.add_argument("--group-size", type=int, default=4, help="--overlap: samples per group")
    ap.add_argument("--staleness", type=int, default=0, help="--overlap: trainer.max_staleness")
    ap.add_argument("--concurrency", type=int, default=8, help="--overlap: rollout.max_concurrent_trajectories "
                    "(below a step's trajectories, its groups end one wave after another)")
    ap.add_argument("--overlap-teacher", default="student", help="--overlap: the teacher's model.source "
                    "(student: the student's own initial weights)")
    ap.add_argument("--vopd", action="store_true", help="opd with vOPD's baseline against plain opd (in place of "
                    "opd against grpo)")
    ap.add_argument("--top-k", type=int, default=20, help="--vopd: the teacher's top-k its baseline sums over")
    ap.add_argument("--gemma", action="store_true", help="only the cross-tokenizer pair of issue 74: Gemma 3 270M "
                    "teaches SmolLM2-135M-Instruct the calculator task (--steps steps)")
    ap.add_argument("--keep", help="--gemma: write the runs (traces, metrics) under this directory, kept")
    ap.add_argument("--gemma-opd", default="", help="--gemma: the opd arm's extra overrides")
    args = ap.parse_args(argv)
    if args.eval_every is None:
        args.eval_every = 4 if args.gemma else 2
    if args.steps is None:
        args.steps = 12 if args.gemma or args.across or args.overlap else 64
    if args.gemma:
        print(f"machine: {machine()}")
        return gemma(args)
    if args.overlap:
        register()
        print(f"machine: {machine()}")
        return overlap(args)
    if args.across:
        register()
        print(f"machine: {machine()}")
        return across(args)
    if args.quick:
        args.seeds, args.steps, args.teacher_steps = 1, 4, 8
    AlignedSuccess.threshold = args.threshold
    register()
    print(f"machine: {machine()}")
    print(f"workload: peaked tiny-qwen3, aligned-token reward, {args.steps} steps × 2 prompts × 8 samples (unless an "
          f"arm sets rollout.n) × "
          f"≤ {args.max_new_tokens} tokens, seeds 0-{args.seeds - 1}; held-out: {EVAL} trajectories, success = "
          f"≥ {args.threshold:g} aligned; opd: {args.opd}; grpo: {args.grpo}\n")
    with tempfile.TemporaryDirectory(prefix="distill-") as tmp:
        from toolrl.training.export import export

        base = Path(tmp)
        model = peaked_model(base / "model")
        t0 = time.perf_counter()
        train(model, base / "teacher-run", 0, args.teacher_steps, args, shlex.split(args.teacher), args.teacher_steps)
        teacher = export(base / "teacher-run", base / "teacher")
        # The target is 90% of the teacher's success: measured on 1,024 trajectories, as one evaluation of 64
        # spreads by ±2-3 (a teacher that trained every weight: 58, 53, 55 and 56/64 at four seeds; 55.2 on 1,024).
        teacher_ok = held_out(teacher, base / "teacher-eval", args, samples=TEACHER_SAMPLES)
        before = round(held_out(model, base / "before-eval", args))
        print(f"teacher: {args.teacher_steps} steps, {time.perf_counter() - t0:.0f} s; held-out success: teacher "
              f"{teacher_ok:.1f}/{EVAL} (on {PROBLEMS * TEACHER_SAMPLES:,} trajectories), untrained student "
              f"{before:.0f}/{EVAL}", flush=True)
        opd = [*shlex.split(args.opd), f"algorithm.teacher={{model: {teacher}}}"]
        # The 0/1 reward is also the run's held-out metric (a metric must be one of the run's reward terms).
        grpo_reward = ["reward.functions=[{name: aligned_success}]", "eval.metric=aligned_success",
                       "eval.success_threshold=0.5"] if args.grpo_reward == "success" else []
        arms = {"vopd": [*opd, f"algorithm.advantage_options={{top_k: {args.top_k}, baseline: vopd}}"], "opd": opd} \
            if args.vopd else {"opd": opd, "grpo": [*shlex.split(args.grpo), *grpo_reward]}
        curves: dict[str, list[list[tuple[float, float]]]] = {}
        for name, arm in arms.items():
            for seed in range(args.seeds):
                t0 = time.perf_counter()
                points = train(model, base / f"{name}-{seed}", seed, args.steps, args, arm, args.eval_every)
                curve = [(0, before), *((t, s) for t, s, _ in points)]
                curves.setdefault(name, []).append([(float(t), float(s)) for t, s in curve])
                print(f"{name} seed {seed}: {time.perf_counter() - t0:.0f} s; held-out successes at tokens "
                      + " ".join(f"{s}@{t}" for t, s in curve) + "; the mean advantage at those steps "
                      + " ".join(f"{a:.2f}" for _, _, a in points), flush=True)
    # Each arm's curve to its own end: arms that sample fewer tokens a step (a smaller rollout.n) end sooner.
    ends = {name: min(c[-1][0] for c in cs) for name, cs in curves.items()}
    marks = [max(ends.values()) * k / 6 for k in range(7)]
    rows = [[name, *[f"{v:.1f}" if m <= ends[name] else "-" for m, v in zip(marks, mean_curve(cs, marks))]]
            for name, cs in curves.items()]
    print(f"\nheld-out successes of {EVAL} (mean over {args.seeds} seeds) at generated tokens; teacher {teacher_ok:.1f}")
    print(table(["method", *[f"{m:.0f}" for m in marks]], rows))
    target = 0.9 * teacher_ok
    reached = {}
    for name, cs in curves.items():
        fine = [ends[name] * k / 200 for k in range(201)]
        reached[name] = tokens_to(target, list(zip(fine, mean_curve(cs, fine), strict=True)))
    for name, value in reached.items():
        print(f"{name}: tokens to {target:.1f}/{EVAL} (90% of the teacher's): "
              f"{f'not within its {ends[name]:.0f}' if value is None else f'{value:.0f}'}")
    for name, cs in curves.items():  # the whole curve in one line: a collapse after the best shows
        points = [t for t, _ in cs[0]]
        mean = mean_curve(cs, points)
        best = max(range(len(mean)), key=mean.__getitem__)
        print(f"{name}: best {mean[best]:.1f}/{EVAL} at {points[best]:.0f} tokens, lowest after it "
              f"{min(mean[best:]):.1f}/{EVAL}, last {mean[-1]:.1f}/{EVAL}")
    first, anchor = arms
    if reached[first] is not None and reached[anchor] is None:  # a bound: the anchor needs more than its run
        ratio = f"< {reached[first] / ends[anchor]:.2f} ({anchor} did not reach it within {ends[anchor]:.0f} tokens)"
    elif reached[first] is None or reached[anchor] is None:
        ratio = "n/a (" + " and ".join(f"{n} did not reach it within {ends[n]:.0f} tokens"
                                        for n, v in reached.items() if v is None) + ")"
    else:
        ratio = f"{reached[first] / max(reached[anchor], 1e-9):.2f}"
    print(f"\ntokens to 90% of the teacher's success, {first}/{anchor}: {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
