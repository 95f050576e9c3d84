#!/usr/bin/env bash
# Sets up .venv (scripts/setup_demo.sh with the textarena plugin) and runs the self-play demo: GRPO trains
# SmolLM2-135M-Instruct by self-play on TextArena's TicTacToe, one policy in both seats, a baseline per seat
# (examples/selfplay.yaml). The held-out split, 64 games against the random player (which training never
# plays), is evaluated before training (toolrl eval) and on the trained weights at the last step
# (trainer.eval_every); extra arguments go to the training run only.
# The last line: the held-out win rate against the random player, before → after.
set -euo pipefail
cd "$(dirname "$0")/.."
name=selfplay
step() { echo "$name: $*" >&2; }  # a plain line per phase, so a log file shows where it is
bash scripts/setup_demo.sh ./plugins/textarena
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
rm -rf "runs/$name" "runs/$name-eval"
step "evaluating against the random player before training"
.venv/bin/toolrl eval "examples/$name.yaml" --output "runs/$name-eval/before"
step "training by self-play (runs/$name), the held-out games played at its last step"
.venv/bin/toolrl train "examples/$name.yaml" "$@"
after="$(ls "runs/$name/eval/"step_*.jsonl | tail -1)"
.venv/bin/python -m toolrl_textarena.report "runs/$name-eval/before/results.jsonl" "$after" random
