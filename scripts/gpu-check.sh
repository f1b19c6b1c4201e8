#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU, the CUDA toolkit, CMake, a C++ compiler and
# Python (+torch, transformers, peft), and nothing else of ktune's dependencies, build the CUDA
# backend from this source tree alone (-DKTUNE_CPU_ENGINE=OFF: core, src/kernels/cuda, src/model/cuda,
# their tests, bench/gpu), then run, each part on its own so that one failing leaves the others running:
#   1. the CUDA tests: every kernel and the GPU decoder step against the CPU references (three
#      processes: the kernels, the GEMM attention path, the decoder step)
#   2. the GEMM benchmark beside torch.matmul (and attention fwd+bwd beside torch sdpa; QLoRA's NF4
#      GEMMs dequantised into scratch or fused)
#   3. the training-step benchmark: Llama-3.2-1B shape, seq 2048, LoRA and full fine-tune (the
#      attention kernels chosen as the recipes choose them: each timed on one layer, the fastest that
#      agrees with the others; LoRA once more on the GEMM path when that was not the choice), beside
#      PyTorch (+PEFT) on the same GPU: tokens/s, MFU (990 TFLOP/s bf16 peak), peak memory, ratios
#   4. the memory check: ktune alone at torchtune's published memory settings (Llama 3.2 3B, batch 2 x
#      seq 4096, activation checkpointing and offloading; LoRA 8.5 GiB, QLoRA 4.6 GiB), when time is left
# and print a summary naming what passed, failed, was skipped or ran out of time.
# Budget: 8 minutes on one H200 (build ~1-2 min on 16 cores); every part has a timeout, and the
# parts after the tests share what is left of GPU_CHECK_BUDGET_S (default 470 s from the start).
#
#   scripts/gpu-check.sh [BUILD_DIR]        (default build/gpu-check)
#   GPU_CHECK_SKIP_BENCH=1                  tests only
#   GPU_CHECK_BUDGET_S=470                  the whole script's time budget in seconds
#   GPU_CHECK_BATCH=4 GPU_CHECK_STEPS=6     the training-step benchmark's batch and timed steps
#   GPU_CHECK_JOBS=N                        build jobs (default: nproc)
#
# Exit 0: everything built, every test passed and every benchmark ran; 77: no GPU (built and linked
# only, nothing tested); 1: something failed (the summary says what).
# It deliberately does not build the CPU engine (no oneDNN, gtest, yaml-cpp on the GPU machine).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD=${1:-build/gpu-check}
START=$(date +%s)
BUDGET=${GPU_CHECK_BUDGET_S:-470}
LOG_DIR="$BUILD/gpu-check-logs"
elapsed() { echo $(( $(date +%s) - START )); }
remaining() { echo $(( BUDGET - $(elapsed) )); }
say() { echo "[gpu-check $(elapsed)s] $*"; }
# A benchmark part's status from its exit code ($1) and where to look when it failed ($2).
status_of() {
  case "$1" in
    0) echo "ok" ;;
    77) echo "skipped (no GPU)" ;;
    *) echo "FAILED (exit $1; $2)" ;;
  esac
}
# min(cap, what is left of the budget minus a reserve for the summary)
part_timeout() {
  local cap=$1 left; left=$(( $(remaining) - 10 )); [ "$left" -lt 5 ] && left=5  # never 0: timeout 0 waits forever
  [ "$left" -lt "$cap" ] && echo "$left" || echo "$cap"
}

BUILD_STATUS="not run"; TEST_STATUS="not run"; TEST_SUMMARY=""; GEMM_STATUS="not run"; STEP_STATUS="not run"; MEMORY_STATUS="not run"
TEST_RC=-1
summary() {
  echo
  echo "===== gpu-check summary ($(elapsed)s of a ${BUDGET}s budget) ====="
  echo "source:  $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$ROOT" diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "build:   $BUILD_STATUS"
  echo "tests:   $TEST_STATUS${TEST_SUMMARY:+ — $TEST_SUMMARY}"
  [ -f "$LOG_DIR/tests.log" ] && grep -E "^FAIL " "$LOG_DIR/tests.log" | sed 's/^/         /'
  [ -f "$LOG_DIR/tests.log" ] && grep -m1 -E "^SKIP " "$LOG_DIR/tests.log" | sed 's/^SKIP [^:]*: /         skipped because: /'
  echo "gemm:    $GEMM_STATUS"
  [ -f "$LOG_DIR/gemm.log" ] && grep -E "^ *[0-9]+ +[0-9]+ +[0-9]+ \||^attention |^nf4 gemm |^ERROR" "$LOG_DIR/gemm.log" | sed 's/^/         /'
  echo "step:    $STEP_STATUS"
  [ -f "$LOG_DIR/step.log" ] && grep -E "^SUMMARY |^FAILED parts|^(lora|full) +(ktune|torch)|^ +ERROR |^ +profile |^ +attention kernels timed" "$LOG_DIR/step.log" | sed 's/^/         /'
  echo "memory:  $MEMORY_STATUS"
  [ -f "$LOG_DIR/memory.log" ] && grep -E "^MEMORY " "$LOG_DIR/memory.log" | sed 's/^/         /'
  echo "logs:    $LOG_DIR"
}
finish() {  # $1: exit code
  summary
  case "$1" in
    0) echo "RESULT: PASS" ;;
    77) echo "RESULT: SKIPPED (no GPU: built and linked only, nothing tested)" ;;
    *) echo "RESULT: FAIL" ;;
  esac
  exit "$1"
}

# nvcc often lives outside PATH.
for d in /usr/local/cuda/bin /usr/local/cuda-13/bin /usr/local/cuda-13.0/bin; do
  if [ -x "$d/nvcc" ] && ! command -v nvcc >/dev/null 2>&1; then export PATH="$d:$PATH"; fi
done
mkdir -p "$LOG_DIR"
if ! command -v nvcc >/dev/null 2>&1; then BUILD_STATUS="FAILED: nvcc not found (PATH=$PATH)"; finish 1; fi
GENERATOR=(); KEEP_GOING=(-- -k)
if command -v ninja >/dev/null 2>&1; then GENERATOR=(-G Ninja); KEEP_GOING=(-- -k 0); fi
JOBS=${GPU_CHECK_JOBS:-$(nproc 2>/dev/null || echo 4)}

say "nvcc: $(nvcc --version | tail -1)"
say "cmake: $(cmake --version | head -1)"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | sed 's/^/[gpu-check] gpu: /'
else
  say "nvidia-smi not found"
fi

# ---- configure and build: every target attempted (keep going), each binary checked on its own ----
say "configure $BUILD (CUDA only)"
if ! cmake -S . -B "$BUILD" "${GENERATOR[@]}" -DCMAKE_BUILD_TYPE=Release -DKTUNE_CPU_ENGINE=OFF -DKTUNE_CUDA=ON \
     >"$LOG_DIR/configure.log" 2>&1; then
  tail -40 "$LOG_DIR/configure.log"; BUILD_STATUS="FAILED: configure (see $LOG_DIR/configure.log)"; finish 1
fi
TESTS_BIN="$BUILD/tests/kernels/cuda/ktune_cuda_kernels_tests"
GEMM_BIN="$BUILD/bench/gpu/ktune_gpu_gemm_bench"
STEP_BIN="$BUILD/bench/gpu/ktune_gpu_train_step_bench"
rm -f "$TESTS_BIN" "$GEMM_BIN" "$STEP_BIN"  # a stale binary must not pass for a fresh one
say "build with $JOBS jobs"
timeout "$(part_timeout 300)" cmake --build "$BUILD" -j "$JOBS" \
  --target ktune_cuda_kernels_tests ktune_gpu_gemm_bench ktune_gpu_train_step_bench "${KEEP_GOING[@]}" \
  >"$LOG_DIR/build.log" 2>&1
BUILD_RC=$?
MISSING=()
for b in "$TESTS_BIN" "$GEMM_BIN" "$STEP_BIN"; do [ -x "$b" ] || MISSING+=("$(basename "$b")"); done
if [ "$BUILD_RC" -eq 0 ] && [ ${#MISSING[@]} -eq 0 ]; then
  BUILD_STATUS="ok"
else
  grep -E "error|FAILED" "$LOG_DIR/build.log" | head -40
  BUILD_STATUS="FAILED (exit $BUILD_RC; not built: ${MISSING[*]:-none}; see $LOG_DIR/build.log)"
fi
say "build: $BUILD_STATUS"

# ---- 1. tests: three processes, so that a CUDA fault (which poisons its context) in the newest
# code cannot hide the results of the rest: the kernels, then the GEMM attention path and batched
# GEMMs, then the decoder step ----
TEST_GROUPS=("-Decoder,-AttentionGemm,-GemmStrided" "AttentionGemm,GemmStrided" "Decoder")
TEST_GROUP_CAPS=(100 40 60)
if [ -x "$TESTS_BIN" ]; then
  : >"$LOG_DIR/tests.log"
  TEST_RC=0; FAILED_GROUPS=(); SUMMARIES=()
  for i in 0 1 2; do
    say "CUDA tests, group '${TEST_GROUPS[$i]}'"
    timeout "$(part_timeout "${TEST_GROUP_CAPS[$i]}")" "$TESTS_BIN" "${TEST_GROUPS[$i]}" >"$LOG_DIR/tests-$i.log" 2>&1
    rc=$?
    cat "$LOG_DIR/tests-$i.log" | tee -a "$LOG_DIR/tests.log"
    line=$(grep "^ktune CUDA tests:" "$LOG_DIR/tests-$i.log" | tail -1)
    SUMMARIES+=("${line#ktune CUDA tests: } [${TEST_GROUPS[$i]}]")
    if [ "$rc" -eq 77 ]; then TEST_RC=77; continue; fi
    if [ "$rc" -ne 0 ]; then
      FAILED_GROUPS+=("'${TEST_GROUPS[$i]}' (exit $rc$([ "$rc" -eq 124 ] && echo ', timed out'))")
      [ -n "$line" ] || SUMMARIES[$i]="no summary line: crashed or timed out (exit $rc) [${TEST_GROUPS[$i]}]"
    fi
  done
  TEST_SUMMARY=$(IFS=';'; echo "${SUMMARIES[*]}")
  TEST_SUMMARY=${TEST_SUMMARY//;/; }
  if [ "$TEST_RC" -eq 77 ] && [ ${#FAILED_GROUPS[@]} -eq 0 ]; then
    TEST_STATUS="SKIPPED (no GPU)"
  elif [ ${#FAILED_GROUPS[@]} -eq 0 ]; then
    TEST_STATUS="PASS"
  else
    TEST_RC=1
    TEST_STATUS="FAILED in $(IFS=','; echo "${FAILED_GROUPS[*]}")"
  fi
else
  TEST_STATUS="FAILED: not built"
fi

NO_GPU=0
if [ "$TEST_RC" -eq 77 ]; then
  NO_GPU=1
elif [ "$TEST_RC" -lt 0 ] && command -v nvidia-smi >/dev/null 2>&1 && ! nvidia-smi -L >/dev/null 2>&1; then
  NO_GPU=1
elif [ "$TEST_RC" -lt 0 ] && ! command -v nvidia-smi >/dev/null 2>&1; then
  NO_GPU=1
fi

# ---- 2. GEMM benchmark ----
if [ "${GPU_CHECK_SKIP_BENCH:-0}" = 1 ]; then
  GEMM_STATUS="skipped (GPU_CHECK_SKIP_BENCH=1)"; STEP_STATUS="$GEMM_STATUS"; MEMORY_STATUS="$GEMM_STATUS"
elif [ "$NO_GPU" = 1 ]; then
  GEMM_STATUS="skipped (no GPU)"; STEP_STATUS="skipped (no GPU)"; MEMORY_STATUS="skipped (no GPU)"
else
  if [ ! -x "$GEMM_BIN" ]; then
    GEMM_STATUS="FAILED: not built"
  elif [ "$(remaining)" -lt 40 ]; then
    GEMM_STATUS="skipped: out of time budget"
  else
    say "GEMM benchmark (ktune cuBLASLt vs torch.matmul; attention vs torch sdpa)"
    T=$(part_timeout 90)
    if timeout "$T" python3 bench/gpu/gemm_compare.py "$GEMM_BIN" 0.5 >"$LOG_DIR/gemm.log" 2>&1; then
      GEMM_STATUS="ok"
    else
      GEMM_STATUS="FAILED (exit $?; timeout ${T}s; see $LOG_DIR/gemm.log)"
    fi
    cat "$LOG_DIR/gemm.log"
  fi
  # ---- 3. training-step benchmark ----
  if [ ! -x "$STEP_BIN" ]; then
    STEP_STATUS="FAILED: not built"
  elif [ "$(remaining)" -lt 80 ]; then
    STEP_STATUS="skipped: out of time budget ($(remaining)s left)"
  else
    # five parts (ktune and torch, LoRA and full, ktune's attention kernels chosen as the recipes
    # choose them, timed on one layer first; and ktune's LoRA step again on the GEMM path unless that
    # was the choice), each its own subprocess with a timeout; 100 s kept for the memory check
    # (part 4) when there is time for both
    RESERVE=0; [ "$(remaining)" -gt 300 ] && RESERVE=100
    PART=$(( ($(remaining) - 15 - RESERVE) / 5 )); [ "$PART" -gt 100 ] && PART=100
    say "training-step benchmark (ktune vs PyTorch+PEFT), ${PART}s a part"
    timeout $(( 5 * PART + 10 )) python3 bench/gpu/train_step_compare.py "$STEP_BIN" --modes lora,full \
      --also-attention gemm \
      --batch "${GPU_CHECK_BATCH:-4}" --seq 2048 --steps "${GPU_CHECK_STEPS:-6}" --warmup 2 \
      --max-seconds $(( PART / 3 )) --timeout "$PART" >"$LOG_DIR/step.log" 2>&1
    STEP_RC=$?
    cat "$LOG_DIR/step.log"
    STEP_STATUS=$(status_of "$STEP_RC" "see the parts named below and $LOG_DIR/step.log")
  fi
  # ---- 4. memory check (informative: the step benchmark's settings are the targets' first) ----
  if [ ! -x "$STEP_BIN" ]; then
    MEMORY_STATUS="FAILED: not built"
  elif [ "$(remaining)" -lt 50 ]; then
    MEMORY_STATUS="skipped: out of time budget ($(remaining)s left)"
  else
    T=$(part_timeout 120)
    say "memory check (3B, batch 2 x 4096, activation checkpointing and offloading), ${T}s"
    timeout "$T" python3 bench/gpu/train_step_compare.py "$STEP_BIN" --memory-check --timeout $(( T / 2 )) \
      >"$LOG_DIR/memory.log" 2>&1
    MEMORY_RC=$?
    cat "$LOG_DIR/memory.log"
    MEMORY_STATUS=$(status_of "$MEMORY_RC" "see $LOG_DIR/memory.log")
  fi
fi

# ---- result ----
if [ "$NO_GPU" = 1 ] && [ "$BUILD_STATUS" = ok ]; then finish 77; fi
if [ "$BUILD_STATUS" = ok ] && [ "$TEST_STATUS" = PASS ] && { [ "$GEMM_STATUS" = ok ] || [ "${GPU_CHECK_SKIP_BENCH:-0}" = 1 ]; } \
   && { [ "$STEP_STATUS" = ok ] || [ "${GPU_CHECK_SKIP_BENCH:-0}" = 1 ]; } && [[ "$MEMORY_STATUS" != FAILED* ]]; then
  finish 0
fi
finish 1
