#!/usr/bin/env bash
# bench/gemm/run.sh BUILD_DIR [--quick] [--cpu-time]: ktune's GEMM ceiling and kernel timings, then PyTorch eager on
# the same shapes with the same threads, and the ratios. About 2 minutes on an idle 2-core machine
# (--quick: about 1; --cpu-time with KTUNE_NUM_THREADS=1: per-core figures on a loaded machine). Build first: cmake --build BUILD_DIR --target ktune_bench_gemm
set -euo pipefail
BUILD=$(realpath "${1:-build/release}")
shift || true
HERE=$(cd "$(dirname "$0")" && pwd)
BIN="$BUILD/bench/gemm/ktune_bench_gemm"
if [ ! -x "$BIN" ]; then
  echo "missing $BIN: cmake --build $BUILD --target ktune_bench_gemm" >&2
  exit 1
fi
export KTUNE_NUM_THREADS=${KTUNE_NUM_THREADS:-$(nproc)}
export OMP_NUM_THREADS=$KTUNE_NUM_THREADS
JSON=$(mktemp)
trap 'rm -f "$JSON"' EXIT
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), load average $(cut -d' ' -f1-3 /proc/loadavg)"
"$BIN" --json "$JSON" "$@"
if python3 -c "import torch" 2>/dev/null; then
  python3 "$HERE/torch_ops.py" "$JSON" "$@"
else
  echo "PyTorch not installed: no peer figures (scripts/setup.sh installs it)"
fi
