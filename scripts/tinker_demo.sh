#!/usr/bin/env bash
# The Tinker demo, on CPU: sets up .venv (toolrl with the tinker plugin and SmolLM2-135M-Instruct's weights:
# scripts/setup_demo.sh) and .venv-cookbook (tinker-cookbook 0.5.8 in a venv of its own, as a user of the
# hosted service has it), starts `toolrl tinker serve` on SmolLM2-135M-Instruct and runs two of the cookbook's
# own recipes against it, unchanged, as a cookbook user trains a model that cannot yet do a task: `chat_sl` on
# a local file of 192 worked additions (3 steps of 64: SmolLM2 adds two numbers up to 100 in 0 of 64 before,
# so RL alone gets no correct answer to reinforce; three steps teach the answer's form and a few sums), then
# `math_rl` on its arithmetic environment from the SL checkpoint (LoRA, importance sampling, 16 groups of 8 a
# step as two streamed minibatches of 64, which bounds the server's memory; a sampler checkpoint every 5
# steps), which does the rest. scripts/tinker_additions.py writes the SL file and grades the base model, the
# SL checkpoint and every RL checkpoint on 64 held-out additions through the SDK. Extra arguments go to the RL
# recipe (key=value, e.g. max_steps=20).
# The last lines: held-out success over the RL run's steps, and its start (the SL checkpoint) → its end.
set -euo pipefail
cd "$(dirname "$0")/.."
step() { echo "tinker demo: $*" >&2; }  # a plain line per phase, so a log file shows where it is
MODEL=HuggingFaceTB/SmolLM2-135M-Instruct RENDERER=qwen3_instruct BATCH_GROUPS=16 STEPS=20 SL_STEPS=3 SL_BATCH=64
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
RUN=("model_name=$MODEL" "renderer_name=$RENDERER" "base_url=$URL" lora_rank=16 eval_every=0
     behavior_if_log_dir_exists=delete)
step "the cookbook's chat_sl recipe on $((SL_STEPS * SL_BATCH)) additions, $SL_STEPS steps (log: $OUT/sl.log)"
.venv-cookbook/bin/python scripts/tinker_additions.py sl-data "$OUT/additions.jsonl" --examples $((SL_STEPS * SL_BATCH))
.venv-cookbook/bin/python -m tinker_cookbook.recipes.chat_sl.train "${RUN[@]}" "log_path=$OUT/sl" "dataset=$OUT/additions.jsonl" \
  "batch_size=$SL_BATCH" learning_rate=1e-3 lr_schedule=constant num_epochs=1 save_every=0 infrequent_eval_every=0 \
  >"$OUT/sl.log" 2>&1 || { tail -n 40 "$OUT/sl.log" >&2; exit 1; }
sl_state=$(.venv-cookbook/bin/python -c 'import json, sys; print([json.loads(l) for l in open(sys.argv[1])][-1]["state_path"])' \
  "$OUT/sl/checkpoints.jsonl")
step "the cookbook's math_rl recipe from $sl_state, $STEPS steps (log: $OUT/rl.log)"
.venv-cookbook/bin/python -m tinker_cookbook.recipes.math_rl.train "${RUN[@]}" "log_path=$OUT/rl" "load_checkpoint_path=$sl_state" \
  env=arithmetic "groups_per_batch=$BATCH_GROUPS" group_size=8 \
  "stream_minibatch_config.groups_per_batch=$BATCH_GROUPS" stream_minibatch_config.num_minibatches=2 \
  learning_rate=5e-4 save_every=5 "max_steps=$STEPS" "$@" \
  >"$OUT/rl.log" 2>&1 || { tail -n 40 "$OUT/rl.log" >&2; exit 1; }
step "held-out success of the base model, the SL checkpoint and the RL run's checkpoints"
.venv-cookbook/bin/python scripts/tinker_additions.py held-out --base-url "$URL" --model "$MODEL" --renderer "$RENDERER" \
  --sl-log "$OUT/sl" --rl-log "$OUT/rl" --sl-examples $((SL_STEPS * SL_BATCH)) --groups-per-batch "$BATCH_GROUPS" \
  --train-batches "$STEPS" 2>>"$OUT/held_out.log"
