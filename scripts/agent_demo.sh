#!/usr/bin/env bash
# Sets up .venv (scripts/demo.sh, with the lookup plugin and the agent frameworks) and runs the agent demo:
# GRPO trains an OpenAI Agents SDK program, unchanged (examples/agents/lookup_sdk.py: its own lookup tool,
# loop and reward; it imports nothing from toolrl), through the gateway, with SmolLM2-135M-Instruct on the
# lookup-chain tasks (examples/agent_lookup.yaml), with held-out success before and after. Extra arguments
# go to the training run only. The last line: held-out success before → after.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/examples/agents${PYTHONPATH:+:$PYTHONPATH}" LOOKUP_CALLS=tags  # the program, its call form
DEMO_EXTRAS=demo,agents bash scripts/demo.sh agent_lookup ./plugins/lookup "$@"
.venv/bin/python scripts/held_out.py runs/agent_lookup-eval/before runs/agent_lookup-eval/after
