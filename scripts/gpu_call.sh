#!/usr/bin/env bash
# The next call on a lent GPU (docs/gpu.md), in two halves.
#   Here, before the call:  scripts/gpu_call.sh prepare BASE   (BASE: the baseline commit, e.g. 1a82fd9)
#     downloads the wheels the device lacks (.whl/) and writes BASE's tree to gpu_base/ (untracked: it
#     travels with the working tree; .whl/ is git-excluded, so the call names it in `carry`).
#   On the device:          bash scripts/gpu_call.sh            (writes under $OUT; about 9 minutes)
#     the suite's goal items on this code, BASE's train/3-steps on the same machine (each ratio compares
#     like with like), then the GPU tests of the static decode and the one-call attention.
set -u
cd "$(dirname "$0")/.."
if [ "${1:-}" = prepare ]; then
  set -e
  bash scripts/gpu_wheels.sh
  rm -rf gpu_base && mkdir gpu_base
  git archive "$2" pyproject.toml README.md core plugins/calculator examples benchmarks | tar -x -C gpu_base
  exit 0
fi
T0=$(date +%s); el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
left() { echo $(( $1 - ($(date +%s) - T0) )); }
PIP="python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir"
$PIP --target /tmp/deps .whl/*.whl
$PIP --no-build-isolation --target /tmp/site . plugins/calculator
[ -d gpu_base ] && (cd gpu_base && $PIP --no-build-isolation --target /tmp/base . plugins/calculator)
el installed
export PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/site:/tmp/deps timeout "$(left 420)" python3 benchmarks/gpu_suite.py --out "$OUT" --profile \
  --only trainer/1.7b-16k-ckpt,trainer/1.7b-16k-ckpt-spans,trainer/1.7b-16k-group-unshared,trainer/1.7b-16k-group-unshared-spans,trainer/1.7b-16k-group-shared,trainer/1.7b-16k-group-shared-spans,engine,train/3-steps 2>&1 | tee "$OUT/log"
el suite done
if [ -d gpu_base ]; then
  mkdir -p "$OUT/base"
  (cd gpu_base && PYTHONPATH=/tmp/base:/tmp/deps timeout "$(left 510)" python3 benchmarks/gpu_suite.py \
    --out "$OUT/base" --only train/3-steps 2>&1 | tee "$OUT/base/log")
  el baseline done
fi
PYTHONPATH=/tmp/site:/tmp/deps timeout "$(left 570)" python3 -m pytest -q -x -p no:cacheprovider tests/test_gpu.py \
  -k "static_decode or one_call" 2>&1 | tail -15 | tee "$OUT/pytest.log"
el end
