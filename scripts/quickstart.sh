#!/usr/bin/env bash
# The README's main job: fine-tune a tiny Llama-shaped model, offline, on the bundled instruction
# dataset (data/quickstart: addition, sorting, "what comes after n"), and show it learning:
# the loss falls, and a held-out prompt's answer goes from wrong to right.
#   scripts/quickstart.sh [BUILD_DIR]      (make quickstart runs it after building)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build/release}
KTUNE="$BUILD/bin/ktune"
ROOT=${KTUNE_QUICKSTART_DIR:-/tmp/ktune-tiny}   # where configs/tiny/* expect the model and data
EPOCHS=${KTUNE_QUICKSTART_EPOCHS:-12}

rm -rf "$ROOT"
mkdir -p "$ROOT/data"
cp data/quickstart/jsonl/train.jsonl data/quickstart/jsonl/validation.jsonl "$ROOT/data/"

echo "== 1. a fresh tiny model (random weights) from examples/quickstart/config.json"
"$KTUNE" init-model --config examples/quickstart/config.json --output-dir "$ROOT/model" --seed 0 \
  --copy examples/quickstart/tokenizer.json --copy examples/quickstart/tokenizer_config.json

# A held-out prompt (validation rows never occur in train), in the alpaca prompt the dataset uses.
PROMPT=$'Below is an instruction that describes a task, paired with an input that provides further context. Write a response that appropriately completes the request.\n\n### Instruction:\nSort the numbers from smallest to largest.\n\n### Input:\n8, 2, 5\n\n### Response:\n'
EXPECTED="2, 5, 8"

echo "== 2. before fine-tuning, the held-out prompt 'Sort 8, 2, 5' gets:"
"$KTUNE" generate --model "$ROOT/model" --chat --max-new-tokens 12 --prompt "$PROMPT"

echo "== 3. ktune run full_finetune_single_device --config tiny/full_single_device ($EPOCHS epochs)"
"$KTUNE" run full_finetune_single_device --config tiny/full_single_device \
  dataset=torchtune.datasets.alpaca_dataset epochs="$EPOCHS"

LAST=$(ls -d "$ROOT"/output/full_single_device/epoch_* | sort -t_ -k2 -n | tail -1)
echo "== 4. after fine-tuning ($LAST), the same prompt gets:"
ANSWER=$("$KTUNE" generate --model "$LAST" --chat --max-new-tokens 12 --prompt "$PROMPT")
echo "$ANSWER"
LOG=$(ls "$ROOT"/output/full_single_device/logs/log_*.txt | tail -1)
echo "== loss: first step $(head -1 "$LOG" | grep -o 'loss:[0-9.]*'), last step $(tail -1 "$LOG" | grep -o 'loss:[0-9.]*')"
if [ "$ANSWER" = "$EXPECTED" ]; then
  echo "== right: expected '$EXPECTED'"
else
  echo "== not yet right: expected '$EXPECTED' (train longer: KTUNE_QUICKSTART_EPOCHS=20)"
fi
