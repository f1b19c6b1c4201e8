#!/usr/bin/env bash
# bench/tokenize/run.sh BUILD_DIR: tokenisation MB/s of ktune vs HF tokenizers, same text (make_corpus.py,
# ~1 MB of prose, code and multilingual text) and same vocabulary: the real Llama 3 and Qwen3
# tokenizer.json from ../shared/data/tokenizers when present (decompressed into BUILD_DIR), else the
# byte-level fixture. Single thread and batch (KTUNE_NUM_THREADS = RAYON_NUM_THREADS, default all cores).
# Environment: TOKENIZE_MB (corpus size, default 1), TOKENIZE_REPEAT (timed passes, default 2).
set -euo pipefail
BUILD=$(realpath "${1:-build/release}")
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BIN="$BUILD/bench/tokenize/ktune_bench_tokenize"
[ -x "$BIN" ] || { echo "missing $BIN: cmake --build $BUILD --target ktune_bench_tokenize" >&2; exit 1; }
THREADS=${KTUNE_NUM_THREADS:-${OMP_NUM_THREADS:-$(nproc)}}
export KTUNE_NUM_THREADS=$THREADS OMP_NUM_THREADS=$THREADS RAYON_NUM_THREADS=$THREADS TOKENIZERS_PARALLELISM=true
REPEAT=${TOKENIZE_REPEAT:-2}
DATA=${KTUNE_TOKENIZER_DATA:-$ROOT/../shared/data/tokenizers}
WORK="$BUILD/bench/tokenize/work"
mkdir -p "$WORK"
python3 "$HERE/make_corpus.py" "$WORK/docs.jsonl" "${TOKENIZE_MB:-1}"
have_hf=1
python3 -c "import tokenizers" 2>/dev/null || have_hf=0

targets=()
for name in llama3 qwen3; do
  if [ -f "$DATA/$name/tokenizer.json.xz" ]; then
    [ -f "$WORK/$name.json" ] || xz -dc "$DATA/$name/tokenizer.json.xz" > "$WORK/$name.json"
    targets+=("$name:$WORK/$name.json")
  fi
done
[ ${#targets[@]} -eq 0 ] && targets=("fixture-byte-level:$ROOT/tests/text/fixtures/byte_level/tokenizer.json")

for t in "${targets[@]}"; do
  label=${t%%:*}; file=${t#*:}
  peer="$WORK/hf_$label.json"
  if [ $have_hf = 1 ]; then
    python3 "$HERE/bench_hf.py" --tokenizer "$file" --docs "$WORK/docs.jsonl" --repeat "$REPEAT" --json "$peer"
  else
    echo "HF tokenizers not installed: ktune only" >&2; echo '{}' > "$peer"
  fi
  "$BIN" --tokenizer "$file" --docs "$WORK/docs.jsonl" --peer "$peer" --repeat "$REPEAT" --label "$label tokenizer.json"
done
