#!/usr/bin/env bash
# bench/gpu: ktune's cuBLASLt bf16 GEMM vs torch.matmul on this GPU (bench/gpu/gemm_compare.py).
# usage: bench/gpu/run.sh BUILD_DIR [seconds per shape]. Prints a skip line where there is no GPU
# or the build has no CUDA backend.
set -euo pipefail
BUILD=$(realpath "${1:-build/release}")
BIN="$BUILD/bench/gpu/ktune_gpu_gemm_bench"
if [ ! -x "$BIN" ]; then
  echo "SKIP bench/gpu: $BIN not built (configure with -DKTUNE_CUDA=ON where nvcc exists)"
  exit 0
fi
python3 "$(dirname "$0")/gemm_compare.py" "$BIN" "${2:-1.0}"
