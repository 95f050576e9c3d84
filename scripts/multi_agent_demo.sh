#!/usr/bin/env bash
# Sets up .venv (scripts/setup_demo.sh with the calculator and duo plugins) and runs the multi-agent demo:
# GRPO trains an agent program of two roles, a planner and an executor (plugins/duo: toolrl_duo.agent,
# each role a model name at the gateway), as two LoRA adapters on one SmolLM2-135M-Instruct
# (examples/multi_agent.yaml). The held-out split is evaluated before training (toolrl eval) and on the
# trained adapters at the last step (trainer.eval_every); extra arguments go to the training run only.
# The last line: the pair's held-out success before → after, and each role's own metric.
set -euo pipefail
cd "$(dirname "$0")/.."
name=multi_agent
step() { echo "$name: $*" >&2; }  # a plain line per phase, so a log file shows where it is
bash scripts/setup_demo.sh ./plugins/calculator ./plugins/duo
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
rm -rf "runs/$name" "runs/$name-eval"
step "evaluating the pair before training"
.venv/bin/toolrl eval "examples/$name.yaml" --output "runs/$name-eval/before"
step "training (runs/$name), the held-out split evaluated at its last step"
.venv/bin/toolrl train "examples/$name.yaml" "$@"
after="$(ls "runs/$name/eval/"step_*.jsonl | tail -1)"
.venv/bin/python -m toolrl_duo.report "runs/$name-eval/before/results.jsonl" "$after"
