#!/usr/bin/env bash
# usage: scripts/demo.sh NAME PLUGIN [train arguments...]
# The CPU demos' one recipe: sets up .venv (scripts/setup_demo.sh with PLUGIN), evaluates the base model
# on examples/NAME.yaml's held-out split, trains (runs/NAME; extra arguments go to the training run only),
# exports, evaluates the trained model and compares the two (runs/NAME-eval/{before,after}).
set -euo pipefail
cd "$(dirname "$0")/.."
name=$1 plugin=$2; shift 2
step() { echo "$name: $*" >&2; }  # a plain line per phase, so a log file shows where it is
bash scripts/setup_demo.sh "$plugin"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
rm -rf "runs/$name" "runs/$name-hf" "runs/$name-eval"
step "evaluating the base model"
.venv/bin/toolrl eval "examples/$name.yaml" --output "runs/$name-eval/before"
step "training (runs/$name)"
.venv/bin/toolrl train "examples/$name.yaml" "$@"
step "exporting and evaluating the trained model"
.venv/bin/toolrl export "runs/$name" "runs/$name-hf"
.venv/bin/toolrl eval "examples/$name.yaml" "model.source=$PWD/runs/$name-hf" --output "runs/$name-eval/after"
step "before (A) and after (B)"
.venv/bin/toolrl eval "runs/$name-eval/before" --compare "runs/$name-eval/after"
