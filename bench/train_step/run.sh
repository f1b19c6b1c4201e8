#!/usr/bin/env bash
# bench/train_step/run.sh BUILD_DIR: PyTorch eager first (its tokens/s into a temp JSON), then ktune,
# which prints its own figures, the GEMM ceiling measured in the same run and both ratios.
# Same shapes, thread count (KTUNE_NUM_THREADS, else all cores) and dtype (f32) for both.
# Environment: TRAIN_STEP_BATCHES (default 1,2,4), TRAIN_STEP_STEPS (timed steps, default 2),
# TRAIN_STEP_SKIP_TORCH=1 to time ktune alone.
set -euo pipefail
BUILD=$(realpath "${1:-build/release}")
HERE=$(cd "$(dirname "$0")" && pwd)
BIN="$BUILD/bench/train_step/ktune_bench_train_step"
[ -x "$BIN" ] || { echo "missing $BIN: cmake --build $BUILD --target ktune_bench_train_step" >&2; exit 1; }
THREADS=${KTUNE_NUM_THREADS:-${OMP_NUM_THREADS:-$(nproc)}}
export KTUNE_NUM_THREADS=$THREADS OMP_NUM_THREADS=$THREADS
BATCHES=${TRAIN_STEP_BATCHES:-1,2,4}
STEPS=${TRAIN_STEP_STEPS:-2}
PEER=$(mktemp /tmp/ktune_train_step_torch.XXXXXX.json)
trap 'rm -f "$PEER"' EXIT
if [ "${TRAIN_STEP_SKIP_TORCH:-0}" != 1 ] && python3 -c "import torch, transformers" 2>/dev/null; then
  python3 "$HERE/train_step_torch.py" --batch "$BATCHES" --steps "$STEPS" --threads "$THREADS" --json "$PEER"
else
  echo "torch train_step: skipped (TRAIN_STEP_SKIP_TORCH=1 or torch/transformers missing)"
  echo '{}' > "$PEER"
fi
"$BIN" --batch "$BATCHES" --steps "$STEPS" --peer "$PEER"
