#!/usr/bin/env bash
# Sets up .venv (scripts/setup_demo.sh with the bfcl plugin, then bfcl-eval itself without the provider SDKs
# it needs only for its own inference) and runs the BFCL demo: GRPO trains SmolLM2-135M-Instruct on BFCL's live
# single-turn categories (examples/bfcl.yaml) and the non-live categories it never trained on are evaluated,
# greedy, before and after (24 entries of each, spread over its file). Extra arguments go to the training run.
# The last line: BFCL non-live AST (held out): before X% → after Y% (irrelevance A% → B%)
set -euo pipefail
cd "$(dirname "$0")/.."
name=bfcl
held_out=(env_options.per_category=24)
step() { echo "$name: $*" >&2; }  # a plain line per phase, so a log file shows where it is
bash scripts/setup_demo.sh ./plugins/bfcl
.venv/bin/pip install -q --disable-pip-version-check --no-deps bfcl-eval==2026.3.23
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
rm -rf "runs/$name" "runs/$name-hf" "runs/$name-eval"
step "evaluating the base model on the held-out (non-live) categories"
.venv/bin/toolrl eval "examples/$name.yaml" "${held_out[@]}" --output "runs/$name-eval/before"
step "training on the live categories (runs/$name)"
.venv/bin/toolrl train "examples/$name.yaml" "$@"
step "exporting and evaluating the trained model"
.venv/bin/toolrl export "runs/$name" "runs/$name-hf"
.venv/bin/toolrl eval "examples/$name.yaml" "${held_out[@]}" "model.source=$PWD/runs/$name-hf" \
    --output "runs/$name-eval/after"
.venv/bin/toolrl eval "runs/$name-eval/before" --compare "runs/$name-eval/after"
.venv/bin/python -m toolrl_bfcl.headline "runs/$name-eval/before" "runs/$name-eval/after"
