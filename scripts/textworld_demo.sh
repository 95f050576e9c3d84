#!/usr/bin/env bash
# Sets up .venv (scripts/setup_demo.sh with the textworld plugin, then TextWorld itself without jericho, its
# z-machine interpreter, a C build the plugin never runs) and runs the TextWorld demo: GRPO trains
# SmolLM2-135M-Instruct on generated TextWorld games (examples/textworld.yaml) and the held-out games it never
# trained on are played before and after, sampled as in training (the example's eval section) and greedy.
# Extra arguments go to the training run. The last two lines:
#   TextWorld held-out games won, greedy: before A/N → after B/N
#   TextWorld held-out games won, sampled at temperature 1, 4 plays a game: before A/N → after B/N
set -euo pipefail
cd "$(dirname "$0")/.."
name=textworld
step() { echo "$name: $*" >&2; }  # a plain line per phase, so a log file shows where it is
bash scripts/setup_demo.sh ./plugins/textworld
.venv/bin/pip install -q --disable-pip-version-check --no-deps textworld==1.7.0
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
rm -rf "runs/$name" "runs/$name-hf" "runs/$name-eval"
GREEDY=(eval.temperature=0 eval.n=1)
step "playing the held-out games with the base model"
.venv/bin/toolrl eval "examples/$name.yaml" --output "runs/$name-eval/before"
.venv/bin/toolrl eval "examples/$name.yaml" "${GREEDY[@]}" --output "runs/$name-eval/before-greedy"
step "training on the training games (runs/$name)"
.venv/bin/toolrl train "examples/$name.yaml" "$@"
step "exporting the trained model and playing the held-out games again"
.venv/bin/toolrl export "runs/$name" "runs/$name-hf"
.venv/bin/toolrl eval "examples/$name.yaml" "model.source=$PWD/runs/$name-hf" --output "runs/$name-eval/after"
.venv/bin/toolrl eval "examples/$name.yaml" "model.source=$PWD/runs/$name-hf" "${GREEDY[@]}" \
  --output "runs/$name-eval/after-greedy"
.venv/bin/toolrl eval "runs/$name-eval/before" --compare "runs/$name-eval/after"
.venv/bin/python -m toolrl_textworld.headline "runs/$name-eval/before-greedy" "runs/$name-eval/after-greedy"
.venv/bin/python -m toolrl_textworld.headline "runs/$name-eval/before" "runs/$name-eval/after"
