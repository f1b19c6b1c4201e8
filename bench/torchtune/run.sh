#!/usr/bin/env bash
# bench/torchtune/run.sh BUILD_DIR: `ktune run` vs torchtune 0.6.1's `tune run` on the CPU, full and
# LoRA, same model shape, data, batch, sequence length, dtype and threads (see compare.py).
# torchtune 0.6.1 needs torchao 0.10, which PEFT (used by the tests) refuses, so both live in a
# virtual environment of their own: $KTUNE_TORCHTUNE_VENV, default BUILD_DIR/torchtune-venv,
# created on first use (it sees the system's torch through --system-site-packages).
# Environment: TORCHTUNE_BENCH_STEPS (default 8), TORCHTUNE_BENCH_KINDS (default full,lora; qlora too),
# TORCHTUNE_BENCH_DTYPE (default fp32; or bf16).
set -euo pipefail
BUILD=$(realpath "${1:-build/release}")
HERE=$(cd "$(dirname "$0")" && pwd)
KTUNE="$BUILD/bin/ktune"
[ -x "$KTUNE" ] || { echo "missing $KTUNE: cmake --build $BUILD --target ktune" >&2; exit 1; }
VENV=${KTUNE_TORCHTUNE_VENV:-$BUILD/torchtune-venv}
if [ ! -x "$VENV/bin/tune" ]; then
  python3 -m venv --system-site-packages "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check torchtune==0.6.1 torchao==0.10.0
fi
THREADS=${KTUNE_NUM_THREADS:-${OMP_NUM_THREADS:-$(nproc)}}
python3 "$HERE/compare.py" --ktune "$KTUNE" --tune "$VENV/bin/tune" --threads "$THREADS" \
  --steps "${TORCHTUNE_BENCH_STEPS:-8}" --kinds "${TORCHTUNE_BENCH_KINDS:-full,lora}" --dtype "${TORCHTUNE_BENCH_DTYPE:-fp32}"
