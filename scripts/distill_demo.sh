#!/usr/bin/env bash
# On-policy distillation on a CPU: sets up .venv (scripts/setup_demo.sh with the calculator plugin), trains the
# teacher (the quickstart's first 8 steps: GRPO teaches SmolLM2-135M-Instruct the calculator), exports it,
# then distils it into a fresh SmolLM2-135M-Instruct (examples/distill.yaml: advantage opd, the reward unread),
# with the held-out split (64 problems, greedy) evaluated for the teacher and for the student before and after.
# Extra arguments go to the student's training run only. The last line:
#   held-out success: student before A/64 → after B/64 (teacher C/64)
set -euo pipefail
cd "$(dirname "$0")/.."
step() { echo "distill: $*" >&2; }  # a plain line per phase, so a log file shows where it is
bash scripts/setup_demo.sh ./plugins/calculator
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
rm -rf runs/distill-teacher runs/distill-teacher-hf runs/distill runs/distill-hf runs/distill-eval
held_out=(eval.num_samples=64)
step "training the teacher (the quickstart's GRPO run, runs/distill-teacher)"
.venv/bin/toolrl train examples/quickstart.yaml trainer.output_dir=runs/distill-teacher trainer.total_steps=8
.venv/bin/toolrl export runs/distill-teacher runs/distill-teacher-hf
step "evaluating the teacher and the untrained student"
.venv/bin/toolrl eval examples/quickstart.yaml "${held_out[@]}" "model.source=$PWD/runs/distill-teacher-hf" \
    --output runs/distill-eval/teacher
.venv/bin/toolrl eval examples/quickstart.yaml "${held_out[@]}" --output runs/distill-eval/before
step "distilling the teacher into the student (runs/distill)"
.venv/bin/toolrl train examples/distill.yaml "$@"
.venv/bin/toolrl export runs/distill runs/distill-hf
step "evaluating the distilled student"
.venv/bin/toolrl eval examples/quickstart.yaml "${held_out[@]}" "model.source=$PWD/runs/distill-hf" \
    --output runs/distill-eval/after
.venv/bin/python scripts/held_out.py runs/distill-eval/before runs/distill-eval/after runs/distill-eval/teacher
