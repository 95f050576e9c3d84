#!/usr/bin/env bash
# Sets up .venv (CPU torch, toolrl with the demo extras, the calculator plugin) and runs the CPU demo:
# GRPO teaches SmolLM2-135M-Instruct to use the calculator, with held-out accuracy (the arithmetic
# environment's test split, greedy) before and after. Extra arguments go to the training run only.
set -euo pipefail
cd "$(dirname "$0")/.."
exec bash scripts/demo.sh quickstart ./plugins/calculator "$@"
