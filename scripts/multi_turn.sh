#!/usr/bin/env bash
# Sets up .venv (scripts/demo.sh, with the lookup plugin) and runs the multi-turn CPU demo: GRPO
# teaches SmolLM2-135M-Instruct to follow a chain of keys in the lookup-chain environment (lookup,
# lookup, answer: three calls in three turns, state kept per trajectory), with held-out success before
# and after. Extra arguments go to the training run only. The last line: held-out success before → after.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/demo.sh multi_turn ./plugins/lookup "$@"
.venv/bin/python - runs/multi_turn-eval/before runs/multi_turn-eval/after <<'PY'
import json, sys
a, b = (json.load(open(f"{d}/summary.json")) for d in sys.argv[1:])
solved = [round(s["pass@1"] * s["num_samples"]) for s in (a, b)]
print(f"held-out success: before {solved[0]}/{a['num_samples']} → after {solved[1]}/{b['num_samples']} "
      f"(per episode: turns {a['turns_mean']:.2f} → {b['turns_mean']:.2f}, "
      f"tool calls {a['tool_calls_per_trajectory']:.2f} → {b['tool_calls_per_trajectory']:.2f})")
PY
