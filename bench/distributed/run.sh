#!/usr/bin/env bash
# bench/distributed/run.sh BUILD_DIR: full_finetune_distributed on a ~27M-parameter Llama-shaped
# model (model_config.json, the quickstart's tokenizer and data) at W = 1 and W = 2 processes, each
# sharded (FSDP, the default) and replicated (KTUNE_DATA_PARALLEL=replicate, DDP), the same global
# batch everywhere. Prints per case: mean step time (steps after the first), the per-rank
# parameter + gradient + AdamW bytes the run reports (equal on every rank: same layout), and each
# rank's peak RSS during the training steps (before the first checkpoint) and overall (rank 0 also
# gathers and writes the checkpoint). Then `ktune plan` for the same model, for comparison.
# The peer here is the replicated run (ratio sharded/replicated); the thread count per rank is the
# launcher's default (cores / processes), so W = 2 runs on the same cores as W = 1.
# Environment: DIST_BENCH_STEPS (default 6), DIST_BENCH_BATCH (global batch, default 4).
set -euo pipefail
BUILD=$(realpath "${1:-build/release}")
HERE=$(cd "$(dirname "$0")" && pwd)
SRC=$(cd "$HERE/../.." && pwd)
KTUNE="$BUILD/bin/ktune"
[ -x "$KTUNE" ] || { echo "missing $KTUNE: cmake --build $BUILD --target ktune" >&2; exit 1; }
STEPS=${DIST_BENCH_STEPS:-6}
BATCH=${DIST_BENCH_BATCH:-4}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ktune_bench_distributed.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

"$KTUNE" init-model --config "$HERE/model_config.json" --output-dir "$WORK/model" --seed 1 \
  --copy "$SRC/examples/quickstart/tokenizer.json" --copy "$SRC/examples/quickstart/tokenizer_config.json" >/dev/null
PARAMS=$(python3 -c "import json;c=json.load(open('$HERE/model_config.json'));print(c['hidden_size'],c['num_hidden_layers'],c['vocab_size'])")
echo "config: llama-shaped model (hidden, layers, vocab = $PARAMS), full_finetune_distributed, fp32, global batch $BATCH, $STEPS steps, $(nproc) cores"
echo "machine load before: $(cut -d' ' -f1-3 /proc/loadavg) (step times on a shared machine drift with it)"

run_case() {  # world mode
  local world=$1 mode=$2 out="$WORK/out_$1_$2" launcher=""
  [ "$world" -gt 1 ] && launcher="--nproc_per_node $world --standalone"
  # shellcheck disable=SC2086
  KTUNE_DATA_PARALLEL=$mode "$KTUNE" run $launcher full_finetune_distributed --config tiny/full_single_device \
    "output_dir=$out" "checkpointer.checkpoint_dir=$WORK/model" "tokenizer.path=$WORK/model/tokenizer.json" \
    dataset=torchtune.datasets.alpaca_dataset dataset.source=json "dataset.data_files=$SRC/data/quickstart/jsonl/train.jsonl" \
    dtype=fp32 seed=7 epochs=1 "max_steps_per_epoch=$STEPS" "batch_size=$((BATCH / world))" shuffle=False \
    >"$out.log" 2>&1 || { cat "$out.log" >&2; echo "W=$world $mode failed" >&2; exit 1; }
  python3 - "$out.log" "$world" "$mode" <<'PY'
import re, sys
log, world, mode = open(sys.argv[1]).read(), sys.argv[2], sys.argv[3]
state = re.search(r"per rank ([0-9.]+) MiB parameters \+ ([0-9.]+) MiB gradients \+ ([0-9.]+) MiB AdamW", log)
total = sum(float(x) for x in state.groups()) if state else float("nan")
steps, ranks = [], []
for m in re.finditer(r"(?:\[rank(\d+)\] )?INFO: training done: \d+ steps in [0-9.]+ s; mean step ([0-9.]+) s over \d+ steps after the first; "
                     r"peak RSS (\d+) MiB \((\d+) MiB before the first checkpoint\)", log):
    steps.append(float(m.group(2)))
    ranks.append((int(m.group(1) or 0), int(m.group(4)), int(m.group(3))))
ranks.sort()
rss = "  ".join(f"rank{r}: {train} MiB training, {overall} MiB overall" for r, train, overall in ranks)
print(f"W={world} {mode:9s} step {max(steps):.3f} s | params+grads+AdamW per rank {total:8.2f} MiB | peak RSS {rss}")
open(sys.argv[1] + ".step", "w").write(f"{max(steps)} {total}\n")
PY
}

for world in 1 2; do
  for mode in shard replicate; do run_case "$world" "$mode"; done
done
python3 - "$WORK" <<'PY'
import sys
w = sys.argv[1]
v = {(W, m): tuple(map(float, open(f"{w}/out_{W}_{m}.log.step").read().split())) for W in (1, 2) for m in ("shard", "replicate")}
for W in (1, 2):
    print(f"W={W}: step time sharded/replicated {v[(W,'shard')][0] / v[(W,'replicate')][0]:.2f}x; "
          f"state per rank sharded/replicated {v[(W,'shard')][1] / v[(W,'replicate')][1]:.3f}")
print(f"sharded state per rank W=2 / W=1: {v[(2,'shard')][1] / v[(1,'shard')][1]:.3f} (ideal 0.5)")
PY
echo "machine load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "ktune plan for the same model (fp32, W=2):"
"$KTUNE" plan --model "$WORK/model" --nproc_per_node 2 --dtype fp32 | sed -n '4,9p'
