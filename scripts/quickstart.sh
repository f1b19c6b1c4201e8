#!/usr/bin/env bash
# The README's main job: fine-tune a tiny Llama-shaped model, offline, on the bundled instruction
# dataset (data/quickstart: addition, sorting, "what comes after n"), and show it learning:
# the loss falls (6.1 -> 0.27 in 10 epochs), and the 40 held-out prompts are scored before and after
# (0 right before; 1-3 after: a ~1M-parameter model mostly memorises 320 rows).
#   scripts/quickstart.sh [BUILD_DIR]      (make quickstart runs it after building)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build/release}
KTUNE="$BUILD/bin/ktune"
ROOT=${KTUNE_QUICKSTART_DIR:-/tmp/ktune-tiny}   # configs/tiny/* expect the model and data here; the
                                                # run below points them at $ROOT, wherever it is
EPOCHS=${KTUNE_QUICKSTART_EPOCHS:-10}
# A model this small is faster on one thread: its GEMMs are too small to pay for a parallel region.
export KTUNE_NUM_THREADS=${KTUNE_NUM_THREADS:-1}

rm -rf "$ROOT"
mkdir -p "$ROOT/data"
cp data/quickstart/jsonl/train.jsonl data/quickstart/jsonl/validation.jsonl "$ROOT/data/"

echo "== 1. a fresh tiny model (random weights) from examples/quickstart/config.json"
"$KTUNE" init-model --config examples/quickstart/config.json --output-dir "$ROOT/model" --seed 0 \
  --copy examples/quickstart/tokenizer.json --copy examples/quickstart/tokenizer_config.json

# The held-out prompts (validation rows never occur in train), in the alpaca prompt the dataset uses.
python3 - "$ROOT/data/validation.jsonl" "$ROOT/heldout" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
with open(sys.argv[2] + ".prompts", "w") as p, open(sys.argv[2] + ".answers", "w") as a:
    for r in rows:
        text = ("Below is an instruction that describes a task, paired with an input that provides further context. "
                "Write a response that appropriately completes the request.\n\n"
                f"### Instruction:\n{r['instruction']}\n\n### Input:\n{r['input']}\n\n### Response:\n")
        p.write(json.dumps(text) + "\n")
        a.write(r["output"] + "\n")
PY

# Greedy answers of MODEL to every held-out prompt; prints "right/total" and writes the answers.
score() {
  local model=$1 out=$2 right=0 total=0
  : > "$out"
  while IFS= read -r prompt && IFS= read -r expected <&3; do
    answer=$("$KTUNE" generate --model "$model" --chat --max-new-tokens 12 \
             --prompt "$(python3 -c 'import json,sys; print(json.loads(sys.argv[1]), end="")' "$prompt")" 2>/dev/null)
    echo "$answer" >> "$out"
    total=$((total + 1))
    [ "$answer" = "$expected" ] && right=$((right + 1))
  done < "$ROOT/heldout.prompts" 3< "$ROOT/heldout.answers"
  echo "$right/$total"
}

echo "== 2. before fine-tuning: held-out answers right: $(score "$ROOT/model" "$ROOT/before.txt")"

echo "== 3. ktune run full_finetune_single_device --config tiny/full_single_device ($EPOCHS epochs)"
"$KTUNE" run full_finetune_single_device --config tiny/full_single_device \
  output_dir="$ROOT/output/full_single_device" checkpointer.checkpoint_dir="$ROOT/model" \
  tokenizer.path="$ROOT/model/tokenizer.json" dataset.data_files="$ROOT/data/train.jsonl" \
  dataset=torchtune.datasets.alpaca_dataset epochs="$EPOCHS" optimizer.lr="${KTUNE_QUICKSTART_LR:-3e-3}"

# The newest epoch by its number (epoch_10 after epoch_9; the path's other underscores are not keys).
LAST="$ROOT/output/full_single_device/epoch_$(ls -d "$ROOT"/output/full_single_device/epoch_* | sed 's/.*epoch_//' | sort -n | tail -1)"
echo "== 4. after fine-tuning ($LAST): held-out answers right: $(score "$LAST" "$ROOT/after.txt")"
LOG=$(ls "$ROOT"/output/full_single_device/logs/log_*.txt | tail -1)
echo "== loss: first step $(head -1 "$LOG" | grep -o 'loss:[0-9.]*'), last step $(tail -1 "$LOG" | grep -o 'loss:[0-9.]*')"
echo "== some held-out prompts (input, or the instruction where there is none -> before | after | expected):"
paste -d'|' <(python3 -c 'import json,sys; [print(r["input"] or r["instruction"]) for r in map(json.loads, open(sys.argv[1]))]' "$ROOT/data/validation.jsonl") \
  "$ROOT/before.txt" "$ROOT/after.txt" "$ROOT/heldout.answers" | head -8 | sed 's/|/  ->  /; s/|/  |  /g'
