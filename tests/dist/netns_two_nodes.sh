#!/usr/bin/env bash
# Two "nodes" on one machine: two network namespaces joined by a veth pair (10.77.0.1 ↔ 10.77.0.2),
# each running `ktune run --nnodes 2 --nproc_per_node 1 --node_rank i --rdzv_endpoint 10.77.0.1:29500`
# as the Kubeflow controller starts a node. A LoRA and a full fine-tune (sharded, the distributed
# recipes' default) must give the losses and weights of a single-node 2-process run; then killing
# the worker of node 1 must end the job on both nodes, non-zero, naming the rank, without a hang.
#   usage: netns_two_nodes.sh <ktune binary> <source dir>
# Exits 77 (ctest SKIP_RETURN_CODE) when namespaces cannot be created here (no CAP_NET_ADMIN, no
# iproute2). Namespaces, processes and files are removed on every exit path.
set -euo pipefail

KTUNE=${1:?usage: netns_two_nodes.sh <ktune binary> <source dir>}
SRC=${2:?usage: netns_two_nodes.sh <ktune binary> <source dir>}
SKIP=77
NS0=ktune_n0_$$
NS1=ktune_n1_$$
VETH0=kt$$a
VETH1=kt$$b
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ktune_netns.XXXXXX")
PIDS=()

cleanup() {
  local pid
  # Our background nodes are `timeout` processes: TERM reaches the launcher through them, and the
  # launcher stops its workers (then KILL after 15 s, in case one does not listen).
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for _ in $(seq 150); do
    local alive=0
    for pid in "${PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break
    sleep 0.1
  done
  for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  # Deleting a namespace removes the veth end inside it, and with it the peer.
  ip netns del "$NS0" 2>/dev/null || true
  ip netns del "$NS1" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

fail() { echo "FAIL: $*" >&2; exit 1; }

if ! command -v ip >/dev/null; then echo "SKIP: iproute2 (ip) is not installed"; exit $SKIP; fi
if ! ip netns add "$NS0" 2>"$WORK/netns.err"; then
  echo "SKIP: cannot create a network namespace here (needs CAP_NET_ADMIN): $(cat "$WORK/netns.err")"
  exit $SKIP
fi
ip netns add "$NS1" || { echo "SKIP: cannot create a second network namespace"; exit $SKIP; }
if ! ip link add "$VETH0" netns "$NS0" type veth peer name "$VETH1" netns "$NS1" 2>"$WORK/veth.err"; then
  echo "SKIP: cannot create a veth pair here: $(cat "$WORK/veth.err")"
  exit $SKIP
fi
ip -n "$NS0" addr add 10.77.0.1/24 dev "$VETH0"
ip -n "$NS1" addr add 10.77.0.2/24 dev "$VETH1"
for ns in "$NS0" "$NS1"; do ip -n "$ns" link set lo up; done
ip -n "$NS0" link set "$VETH0" up
ip -n "$NS1" link set "$VETH1" up

# The tiny model of the quickstart, and one thread per worker everywhere (results then do not
# depend on how many workers share a node).
export KTUNE_NUM_THREADS=1 KTUNE_RDZV_TIMEOUT=120
"$KTUNE" init-model --config "$SRC/examples/quickstart/config.json" --output-dir "$WORK/model" --seed 3 \
  --copy "$SRC/examples/quickstart/tokenizer.json" --copy "$SRC/examples/quickstart/tokenizer_config.json" >/dev/null
common() {  # recipe config output_dir extra...
  local recipe=$1 config=$2 out=$3
  shift 3
  echo "$recipe" --config "tiny/$config" "output_dir=$out" "checkpointer.checkpoint_dir=$WORK/model" \
    "tokenizer.path=$WORK/model/tokenizer.json" dataset=torchtune.datasets.alpaca_dataset dataset.source=json \
    "dataset.data_files=$SRC/data/quickstart/jsonl/train.jsonl" dtype=fp32 seed=7 "$@"
}

# Two nodes, one worker each; node i runs inside namespace i. Returns when both ended (or 300 s).
two_nodes() {  # name recipe config extra...
  local name=$1
  shift
  local args
  args=$(common "$1" "$2" "$WORK/$name" "${@:3}")
  # shellcheck disable=SC2086
  ip netns exec "$NS1" timeout 300 "$KTUNE" run --nnodes 2 --nproc_per_node 1 --node_rank 1 \
    --rdzv_endpoint 10.77.0.1:29500 $args >"$WORK/$name.node1.log" 2>&1 &
  local node1=$!
  PIDS+=("$node1")
  local rc0=0 rc1=0
  # shellcheck disable=SC2086
  ip netns exec "$NS0" timeout 300 "$KTUNE" run --nnodes 2 --nproc_per_node 1 --node_rank 0 \
    --rdzv_endpoint 10.77.0.1:29500 $args >"$WORK/$name.node0.log" 2>&1 || rc0=$?
  wait "$node1" || rc1=$?
  [ "$rc0" = 0 ] || { cat "$WORK/$name.node0.log" >&2; fail "$name: node 0 exited $rc0"; }
  [ "$rc1" = 0 ] || { cat "$WORK/$name.node1.log" >&2; fail "$name: node 1 exited $rc1"; }
  grep -q "sharded data parallel (FSDP) over 2 ranks" "$WORK/$name.node0.log" || fail "$name: not sharded"
}

one_node() {  # name recipe config extra...
  local name=$1
  shift
  # shellcheck disable=SC2046
  timeout 300 "$KTUNE" run --nproc_per_node 2 --standalone $(common "$1" "$2" "$WORK/$name" "${@:3}") \
    >"$WORK/$name.log" 2>&1 || { cat "$WORK/$name.log" >&2; fail "$name: exited non-zero"; }
}

# Losses (from the metric logs) and every tensor of the given files agree within f32 tolerance.
compare() {  # a b files...
  local a=$1 b=$2
  shift 2
  python3 - "$WORK/$a" "$WORK/$b" "$@" <<'EOF' || fail "$a and $b differ"
import glob, re, struct, json, sys
a, b, files = sys.argv[1], sys.argv[2], sys.argv[3:]
def losses(d):
    out = {}
    for f in glob.glob(d + "/logs/log_*.txt"):
        for m in re.finditer(r"Step (\d+) \| loss:([0-9.eE+-]+)", open(f).read()):
            out[int(m.group(1))] = float(m.group(2))
    return out
la, lb = losses(a), losses(b)
assert la and la.keys() == lb.keys(), (la, lb)
worst = max(abs(la[k] - lb[k]) for k in la)
assert worst <= 1e-5, f"losses differ by {worst}: {la} vs {lb}"
def tensors(path):  # safetensors, f32 or bf16, without any package
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        s, e = info["data_offsets"]
        data = raw[8 + n + s:8 + n + e]
        if info["dtype"] == "F32":
            out[name] = struct.unpack(f"<{len(data) // 4}f", data)
        elif info["dtype"] == "BF16":
            out[name] = [struct.unpack("<f", b"\0\0" + data[i:i + 2])[0] for i in range(0, len(data), 2)]
    return out
for f in files:
    ta, tb = tensors(f"{a}/{f}"), tensors(f"{b}/{f}")
    assert ta.keys() == tb.keys(), f
    w = max(max(abs(x - y) for x, y in zip(ta[k], tb[k])) for k in ta)
    assert w <= 1e-5, f"{f}: weights differ by {w}"
print(f"same: {len(la)} losses (max diff {worst:.2e}), {len(files)} weight files")
EOF
}

echo "== LoRA: 2 nodes × 1 worker vs 1 node × 2 workers"
LORA="epochs=1 max_steps_per_epoch=3 batch_size=2 model.lora_rank=4 model.lora_alpha=8 optimizer.lr=1e-2"
# shellcheck disable=SC2086
two_nodes lora2 lora_finetune_distributed lora_single_device $LORA
# shellcheck disable=SC2086
one_node lora1 lora_finetune_distributed lora_single_device $LORA
compare lora2 lora1 epoch_0/adapter_model.safetensors epoch_0/model-00001-of-00001.safetensors

echo "== full: 2 nodes × 1 worker vs 1 node × 2 workers"
FULL="epochs=1 max_steps_per_epoch=3 batch_size=2"
# shellcheck disable=SC2086
two_nodes full2 full_finetune_distributed full_single_device $FULL
# shellcheck disable=SC2086
one_node full1 full_finetune_distributed full_single_device $FULL
compare full2 full1 epoch_0/model-00001-of-00001.safetensors

echo "== killing the worker of node 1 ends the job on both nodes"
# shellcheck disable=SC2046
ip netns exec "$NS1" timeout 300 "$KTUNE" run --nnodes 2 --nproc_per_node 1 --node_rank 1 --rdzv_endpoint 10.77.0.1:29500 \
  $(common full_finetune_distributed full_single_device "$WORK/kill" epochs=1000 batch_size=2) >"$WORK/kill.node1.log" 2>&1 &
NODE1=$!
PIDS+=("$NODE1")
# shellcheck disable=SC2046
ip netns exec "$NS0" timeout 300 "$KTUNE" run --nnodes 2 --nproc_per_node 1 --node_rank 0 --rdzv_endpoint 10.77.0.1:29500 \
  $(common full_finetune_distributed full_single_device "$WORK/kill" epochs=1000 batch_size=2) >"$WORK/kill.node0.log" 2>&1 &
NODE0=$!
PIDS+=("$NODE0")
# Wait for training to start (a logged step), then kill node 1's worker: the launcher's (timeout's
# grandchild's) only child.
for _ in $(seq 600); do
  if grep -qs "Step 1 |" "$WORK"/kill/logs/log_*.txt; then break; fi
  sleep 0.2
done
grep -qs "Step 1 |" "$WORK"/kill/logs/log_*.txt || { cat "$WORK"/kill.node*.log >&2; fail "the 2-node run never trained"; }
LAUNCHER1=$(pgrep -P "$NODE1" || true)  # timeout's child: the launcher of node 1
[ -n "$LAUNCHER1" ] || fail "cannot find node 1's launcher"
WORKER1=$(pgrep -P "$LAUNCHER1" || true)
[ -n "$WORKER1" ] || fail "cannot find node 1's worker"
kill -KILL "$WORKER1"
rc0=0 rc1=0
wait "$NODE0" || rc0=$?
wait "$NODE1" || rc1=$?
for i in 0 1; do
  log="$WORK/kill.node$i.log"
  rc=$([ $i = 0 ] && echo $rc0 || echo $rc1)
  [ "$rc" != 0 ] || { cat "$log" >&2; fail "node $i exited 0 after a worker was killed"; }
  [ "$rc" != 124 ] || { cat "$log" >&2; fail "node $i hung until the 300 s timeout"; }
  grep -q "job failed: .*rank 1 (node1, pid $WORKER1) was killed by signal" "$log" ||
    { cat "$log" >&2; fail "node $i does not name the killed rank"; }
done
echo "both nodes stopped: node0 exit $rc0, node1 exit $rc1"
echo "PASS"
