#!/usr/bin/env bash
# The Tinker demo, on CPU: sets up .venv (toolrl with the tinker plugin and SmolLM2-135M-Instruct's weights:
# scripts/setup_demo.sh) and .venv-cookbook (tinker-cookbook 0.5.8 in a venv of its own, as a user of the
# hosted service has it), starts `toolrl tinker serve` on SmolLM2-135M-Instruct, runs the cookbook's own
# math_rl recipe, unchanged, against it (its arithmetic environment: LoRA, importance sampling, 4 groups of
# 8 a step, trained as two streamed minibatches of 16, which bounds the server's memory), then grades the
# base model and the run's final checkpoint on 64 held-out additions through the SDK
# (scripts/tinker_held_out.py). Extra arguments go to the recipe (key=value, e.g. max_steps=40).
# The last line: held-out success before → after.
set -euo pipefail
cd "$(dirname "$0")/.."
step() { echo "tinker demo: $*" >&2; }  # a plain line per phase, so a log file shows where it is
MODEL=HuggingFaceTB/SmolLM2-135M-Instruct RENDERER=qwen3_instruct BATCH_GROUPS=4 STEPS=10
for arg in "$@"; do  # what the held-out draw must know of the run: the batches it trained on
  case $arg in max_steps=*) STEPS=${arg#*=} ;; groups_per_batch=*) BATCH_GROUPS=${arg#*=} ;; esac
done
bash scripts/setup_demo.sh ./plugins/tinker
PY="$(.venv/bin/python -c 'import os, sys; print(os.path.realpath(sys._base_executable))')"
step "creating .venv-cookbook (tinker-cookbook 0.5.8, its own tinker and transformers)"
"$PY" -m venv .venv-cookbook
# shellcheck disable=SC2046
.venv-cookbook/bin/pip install -q --disable-pip-version-check $("$PY" scripts/cpu_torch.py)
.venv-cookbook/bin/pip install -q --disable-pip-version-check "tinker-cookbook[math-rl]==0.5.8"

OUT=runs/tinker_demo
rm -rf "$OUT" && mkdir -p "$OUT"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" TINKER_API_KEY="tml-demo-$RANDOM$RANDOM"
step "writing $MODEL's tokenizer into $OUT/hf-hub, for the cookbook to load it offline"
exports=$(.venv/bin/toolrl tinker tokenizers "$MODEL" --hub-cache "$OUT/hf-hub")
eval "$exports"  # HF_HUB_CACHE and HF_HUB_OFFLINE
step "starting the server (log: $OUT/serve.log)"
.venv/bin/toolrl tinker serve --base "$MODEL" --port 0 --state-dir "$OUT/state" >"$OUT/serve.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
until URL=$(grep -o 'http://[^ ]*' "$OUT/serve.log" 2>/dev/null); do
  kill -0 $server 2>/dev/null || { cat "$OUT/serve.log" >&2; exit 1; }
  sleep 1
done
step "the cookbook's math_rl recipe against $URL, $STEPS steps (log: $OUT/cookbook)"
.venv-cookbook/bin/python -m tinker_cookbook.recipes.math_rl.train "model_name=$MODEL" "renderer_name=$RENDERER" \
  "base_url=$URL" "log_path=$OUT/cookbook" env=arithmetic "groups_per_batch=$BATCH_GROUPS" group_size=8 \
  lora_rank=16 \
  "stream_minibatch_config.groups_per_batch=$BATCH_GROUPS" stream_minibatch_config.num_minibatches=2 \
  learning_rate=4e-4 "max_steps=$STEPS" eval_every=0 save_every=0 behavior_if_log_dir_exists=delete "$@" \
  >"$OUT/cookbook.log" 2>&1 || { tail -n 40 "$OUT/cookbook.log" >&2; exit 1; }
step "held-out success of the base model and of the final checkpoint"
.venv-cookbook/bin/python scripts/tinker_held_out.py --base-url "$URL" --model "$MODEL" --renderer "$RENDERER" \
  --log-path "$OUT/cookbook" --groups-per-batch "$BATCH_GROUPS" --train-batches "$STEPS" 2>>"$OUT/held_out.log"
