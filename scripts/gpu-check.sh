#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU, the CUDA toolkit, CMake, a C++ compiler and
# Python (+torch), and nothing else of ktune's dependencies, build the CUDA backend from this source
# tree alone (-DKTUNE_CPU_ENGINE=OFF: core, src/kernels/cuda, their tests, bench/gpu), run every
# CUDA kernel test against the CPU references, run the GEMM benchmark beside torch.matmul (and
# attention forward+backward beside torch's scaled_dot_product_attention), and
# print a summary. Budget: well under 8 minutes on one H200 (build ~1-2 min on 16 cores).
#
#   scripts/gpu-check.sh [BUILD_DIR]        (default build/gpu-check)
#   GPU_CHECK_SKIP_BENCH=1                  tests only
#
# Exit 0: every test passed; 77: no GPU, everything skipped (a build-only check); 1: a failure.
# It deliberately does not build the CPU engine, nor run the training-step benchmark (not written yet).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD=${1:-build/gpu-check}
START=$(date +%s)
LOG_DIR="$BUILD/gpu-check-logs"
elapsed() { echo $(( $(date +%s) - START )); }
say() { echo "[gpu-check $(elapsed)s] $*"; }

# nvcc often lives outside PATH.
for d in /usr/local/cuda/bin /usr/local/cuda-13/bin /usr/local/cuda-13.0/bin; do
  if [ -x "$d/nvcc" ] && ! command -v nvcc >/dev/null 2>&1; then export PATH="$d:$PATH"; fi
done
command -v nvcc >/dev/null 2>&1 || { say "FAIL: nvcc not found (PATH=$PATH)"; exit 1; }
GENERATOR=()
command -v ninja >/dev/null 2>&1 && GENERATOR=(-G Ninja)
JOBS=$(nproc 2>/dev/null || echo 4)

say "nvcc: $(nvcc --version | tail -1)"
say "cmake: $(cmake --version | head -1)"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | sed 's/^/[gpu-check] gpu: /'
else
  say "nvidia-smi not found"
fi

mkdir -p "$LOG_DIR"
say "configure $BUILD (CUDA only)"
if ! cmake -S . -B "$BUILD" "${GENERATOR[@]}" -DCMAKE_BUILD_TYPE=Release -DKTUNE_CPU_ENGINE=OFF -DKTUNE_CUDA=ON \
     >"$LOG_DIR/configure.log" 2>&1; then
  tail -40 "$LOG_DIR/configure.log"; say "FAIL: configure (full log: $LOG_DIR/configure.log)"; exit 1
fi
say "build with $JOBS jobs"
if ! cmake --build "$BUILD" -j "$JOBS" --target ktune_cuda_kernels_tests ktune_gpu_gemm_bench \
     >"$LOG_DIR/build.log" 2>&1; then
  grep -E "error|FAILED" "$LOG_DIR/build.log" | head -40; say "FAIL: build (full log: $LOG_DIR/build.log)"; exit 1
fi
say "built"

say "CUDA kernel tests"
timeout 300 "$BUILD/tests/kernels/cuda/ktune_cuda_kernels_tests" 2>&1 | tee "$LOG_DIR/tests.log"
TEST_RC=${PIPESTATUS[0]}
TEST_SUMMARY=$(grep "^ktune CUDA tests:" "$LOG_DIR/tests.log" | tail -1)
[ -n "$TEST_SUMMARY" ] || TEST_SUMMARY="ktune CUDA tests: no summary line (exit code $TEST_RC: crashed or timed out?)"

BENCH_STATUS="not run"
if [ "${GPU_CHECK_SKIP_BENCH:-0}" != 1 ] && [ "$TEST_RC" -ne 77 ]; then
  say "GEMM benchmark (ktune cuBLASLt vs torch.matmul)"
  if timeout 240 python3 bench/gpu/gemm_compare.py "$BUILD/bench/gpu/ktune_gpu_gemm_bench" 1.0 2>&1 | tee "$LOG_DIR/bench.log"; then
    BENCH_STATUS="ok"
  else
    BENCH_STATUS="failed (see $LOG_DIR/bench.log)"
  fi
elif [ "$TEST_RC" -eq 77 ]; then
  BENCH_STATUS="skipped (no GPU)"
fi

echo
echo "===== gpu-check summary ($(elapsed)s) ====="
echo "source:  $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
echo "tests:   $TEST_SUMMARY"
grep -E "^FAIL " "$LOG_DIR/tests.log" | sed 's/^/         /'
grep -m1 -E "^SKIP " "$LOG_DIR/tests.log" | sed 's/^SKIP [^:]*: /         skipped because: /'
echo "bench:   $BENCH_STATUS"
[ "$BENCH_STATUS" = ok ] && grep -E "^ *[0-9]+ +[0-9]+ +[0-9]+ \||^attention " "$LOG_DIR/bench.log" | sed 's/^/         /'
echo "logs:    $LOG_DIR"
case "$TEST_RC" in
  0) echo "RESULT: PASS"; exit 0 ;;
  77) echo "RESULT: SKIPPED (no GPU: built and linked only, nothing tested)"; exit 77 ;;
  *) echo "RESULT: FAIL (test exit code $TEST_RC)"; exit 1 ;;
esac
