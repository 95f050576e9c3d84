#!/usr/bin/env bash
# Sets up .venv (scripts/demo.sh, with the lookup plugin) and runs the multi-turn CPU demo: GRPO teaches
# SmolLM2-135M-Instruct to follow a chain of keys in the lookup-chain environment (lookup, lookup, answer:
# three calls in three turns, state kept per trajectory), with held-out success before and after. Extra
# arguments go to the training run only. The last line: held-out success before → after.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/demo.sh multi_turn ./plugins/lookup "$@"
.venv/bin/python scripts/held_out.py runs/multi_turn-eval/before runs/multi_turn-eval/after
