#!/usr/bin/env bash
# bench/generate/run.sh BUILD_DIR: `ktune generate` vs HF transformers' generate() on the CPU, the
# same random-weight Llama-shaped model, prompt, greedy decoding and threads (see compare.py).
# Environment: GENERATE_BENCH_SHAPE (default small; or 1b: Llama-3.2-1B's shape, ~5 GiB in f32),
# GENERATE_BENCH_PROMPT_TOKENS (default 200), GENERATE_BENCH_NEW_TOKENS (default 64),
# GENERATE_BENCH_SAMPLING ("TEMPERATURE TOP_K TOP_P", e.g. "0.8 0 0.9"; default greedy).
set -euo pipefail
BUILD=$(realpath "${1:-build/release}")
HERE=$(cd "$(dirname "$0")" && pwd)
KTUNE="$BUILD/bin/ktune"
[ -x "$KTUNE" ] || { echo "missing $KTUNE: cmake --build $BUILD --target ktune" >&2; exit 1; }
THREADS=${KTUNE_NUM_THREADS:-${OMP_NUM_THREADS:-$(nproc)}}
python3 "$HERE/compare.py" --ktune "$KTUNE" --threads "$THREADS" --shape "${GENERATE_BENCH_SHAPE:-small}" \
  --prompt-tokens "${GENERATE_BENCH_PROMPT_TOKENS:-200}" --new-tokens "${GENERATE_BENCH_NEW_TOKENS:-64}" \
  $(read -r t k p <<<"${GENERATE_BENCH_SAMPLING:-0 0 1}"; echo --temperature "$t" --top-k "$k" --top-p "$p")
