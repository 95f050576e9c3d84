#!/usr/bin/env bash
# Sets up .venv (CPU torch, toolrl with the demo extras, the calculator plugin) and runs the CPU demo:
# GRPO teaches SmolLM2-135M-Instruct to use the calculator, with held-out accuracy before and after.
set -euo pipefail
cd "$(dirname "$0")/.."
step() { echo "quickstart: $*" >&2; }  # a plain line per phase, so a log file shows where it is
bash scripts/setup_demo.sh ./plugins/calculator
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
# Held-out accuracy before and after training (the arithmetic environment's test split, greedy).
# Extra arguments go to the training run only.
rm -rf runs/quickstart runs/quickstart-hf runs/quickstart-eval
step "evaluating the base model"
.venv/bin/toolrl eval examples/quickstart.yaml --output runs/quickstart-eval/before
step "training (runs/quickstart)"
.venv/bin/toolrl train examples/quickstart.yaml "$@"
step "exporting and evaluating the trained model"
.venv/bin/toolrl export runs/quickstart runs/quickstart-hf
.venv/bin/toolrl eval examples/quickstart.yaml "model.source=$PWD/runs/quickstart-hf" --output runs/quickstart-eval/after
step "before (A) and after (B)"
exec .venv/bin/toolrl eval runs/quickstart-eval/before --compare runs/quickstart-eval/after
