#!/usr/bin/env bash
# Sets up .venv (scripts/setup_demo.sh with the reasoning-gym plugin, then reasoning-gym itself without its
# C-compiled pycosat) and runs the reasoning-gym demo: GRPO trains SmolLM2-135M-Instruct on chain_sum
# (examples/reasoning_gym.yaml). The 64 held-out problems are evaluated before training (toolrl eval) and on
# the trained weights at the last step (trainer.eval_every); extra arguments go to the training run only.
# The last line: held-out success before → after, and on the problems no training batch held.
set -euo pipefail
cd "$(dirname "$0")/.."
name=reasoning_gym
step() { echo "$name: $*" >&2; }  # a plain line per phase, so a log file shows where it is
bash scripts/setup_demo.sh ./plugins/reasoning-gym
.venv/bin/pip install -q --disable-pip-version-check --no-deps reasoning-gym==0.1.25
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
rm -rf "runs/$name" "runs/$name-eval"
step "evaluating the held-out problems before training"
.venv/bin/toolrl eval "examples/$name.yaml" --output "runs/$name-eval/before"
step "training (runs/$name), the held-out problems evaluated at its last step"
.venv/bin/toolrl train "examples/$name.yaml" "$@"
after="$(ls "runs/$name/eval/"step_*.jsonl | tail -1)"
.venv/bin/python -m toolrl_reasoning_gym.report "runs/$name-eval/before/results.jsonl" "$after" "runs/$name/rollouts"
