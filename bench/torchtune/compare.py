#!/usr/bin/env python3
"""ktune vs torchtune 0.6.1 on the CPU: the same fine-tune, run by both, one after the other.

Same model shape (a Llama 3.2-style decoder with the real Llama 3 tokenizer and vocabulary, random
weights), same data (bench/torchtune/data/train.jsonl, alpaca format, unshuffled), same batch, sequence length,
dtype (fp32, or bf16 with --dtype), optimizer (AdamW) and thread count. Full fine-tune and LoRA
(and QLoRA with --kinds ...,qlora: the same LoRA over an NF4 base, torchao's on both sides).
For each tool it reads the per-step times from the tool's own DiskLogger lines (label tokens /
tokens_per_second_per_gpu), drops the first WARMUP steps, and takes the peak RSS of the whole
process (wait4's ru_maxrss). Prints both figures and their ratios; then, against the GEMM ceiling
measured in the same run, each tool's FLOP rate on the arithmetic it does (counted from the batches
torchtune's own dataset code makes: padded positions, the samples' tokens (ktune's padding-free row),
labelled positions)
and the largest speed ratio any step doing ktune's arithmetic could reach — the bound on what the
ratio can show here. It also prints each tool's loss at the first step: the same weights and batch,
and LoRA's B starts at zero, so there it is the frozen base's loss (QLoRA's: the NF4 base's), and the
two tools' losses agree to the arithmetic's rounding (fp32: ~1e-6) only where their models compute the
same function.

    python3 bench/torchtune/compare.py --ktune build/release/bin/ktune --tune /path/venv/bin/tune

torchtune 0.6.1 needs torchao 0.10 (its NF4 module), which PEFT refuses: run.sh keeps both in a
separate virtual environment. The Llama 3 tokenizer comes from ../shared/data/tokenizers/llama3.
"""
import argparse
import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
# The benchmark's rows: the 320 the quickstart shipped until 3a1d011 (addition, sorting, "what number
# comes after n"), kept here so that figures compare across versions. Batches of 8 of them are 13%
# padding (torchtune computes it, ktune's padding-free step does not); real instruction data varies
# more in length. The quickstart's present rows are near one length (1% padding): on them the full
# ratio was 2.56x and 2.97x (bound 3.02x and 3.44x) where these gave 3.7-4.1x.
DATA = os.path.join(HERE, "data", "train.jsonl")
TOKENIZER_XZ = os.path.join(ROOT, "..", "shared", "data", "tokenizers", "llama3", "tokenizer.model.xz")

SHAPE = dict(vocab=128256, dim=512, layers=4, heads=8, kv_heads=2, hidden=1536)


def make_model(model_dir, tokenizer_xz):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=SHAPE["vocab"], hidden_size=SHAPE["dim"], intermediate_size=SHAPE["hidden"],
        num_hidden_layers=SHAPE["layers"], num_attention_heads=SHAPE["heads"], num_key_value_heads=SHAPE["kv_heads"],
        head_dim=SHAPE["dim"] // SHAPE["heads"], max_position_embeddings=131072, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        tie_word_embeddings=True, bos_token_id=128000, eos_token_id=128001, torch_dtype="float32")
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(model_dir, safe_serialization=True)
    os.makedirs(os.path.join(model_dir, "original"), exist_ok=True)
    with lzma.open(tokenizer_xz) as src, open(os.path.join(model_dir, "original", "tokenizer.model"), "wb") as dst:
        shutil.copyfileobj(src, dst)


def overrides(kind, model_dir, out_dir, steps, batch, seq_len, tool, dtype="fp32"):
    common = [
        f"output_dir={out_dir}", f"tokenizer.path={model_dir}/original/tokenizer.model", f"tokenizer.max_seq_len={seq_len}",
        f"checkpointer.checkpoint_dir={model_dir}", "checkpointer.checkpoint_files=[model.safetensors]",
        f"checkpointer.output_dir={out_dir}", "dataset._component_=torchtune.datasets.alpaca_dataset",
        "dataset.source=json", f"dataset.data_files={DATA}", "dataset.split=train", "dataset.packed=False",
        f"batch_size={batch}", "shuffle=False", "seed=0", "epochs=1", f"max_steps_per_epoch={steps}",
        "device=cpu", f"dtype={dtype}", "gradient_accumulation_steps=1", "clip_grad_norm=null",
        "optimizer._component_=torch.optim.AdamW", "optimizer.lr=2e-5",
        "enable_activation_checkpointing=False", "log_peak_memory_stats=False", "log_every_n_steps=1",
        f"metric_logger.log_dir={out_dir}/logs", "compile=False",
    ]
    if kind == "full":
        common += ["optimizer_in_bwd=False"]
    if kind in ("lora", "qlora"):
        common += ["model.quantize_base=" + str(kind == "qlora"),"model.lora_rank=16", "model.lora_alpha=32", "model.lora_dropout=0.0",
                   "model.lora_attn_modules=[q_proj,v_proj,output_proj]", "model.apply_lora_to_mlp=True"]
    if tool == "ktune":
        component = "ktune.models.hf_model" if kind == "full" else "ktune.models.lora_hf_model"
        return [f"model._component_={component}"] + common
    builder = "torchtune.models.llama3_2.llama3_2" if kind == "full" else "torchtune.models.llama3_2.lora_llama3_2"
    return [f"model._component_={builder}", f"model.vocab_size={SHAPE['vocab']}", f"model.num_layers={SHAPE['layers']}",
            f"model.num_heads={SHAPE['heads']}", f"model.num_kv_heads={SHAPE['kv_heads']}", f"model.embed_dim={SHAPE['dim']}",
            "model.max_seq_len=131072", f"model.intermediate_dim={SHAPE['hidden']}"] + common


COUNT_BATCHES = """
import json, sys
from torchtune.datasets import alpaca_dataset
from torchtune.models.llama3 import llama3_tokenizer
tok_path, data, batch, steps, seq_len = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
ds = alpaca_dataset(llama3_tokenizer(tok_path, max_seq_len=seq_len), source="json", data_files=data, split="train",
                    packed=False)
out = []
for s in range(steps):
    rows = [ds[i] for i in range(s * batch, (s + 1) * batch)]
    lengths = [len(r["tokens"]) for r in rows]
    out.append(dict(positions=batch * max(lengths), tokens=sum(lengths),
                    labels=sum(sum(1 for l in r["labels"][1:] if l != -100) for r in rows)))
print(json.dumps(out))
"""


def batch_shapes(tune, model_dir, batch, steps, seq_len):
    """Per step: the padded positions (B x longest row), the samples' real tokens (their lengths summed),
    and the positions with a label, as torchtune's own
    dataset and collation make them (run with torchtune's Python, unshuffled like the runs)."""
    python = os.path.join(os.path.dirname(tune), "python")
    res = subprocess.run([python, "-c", COUNT_BATCHES, os.path.join(model_dir, "original", "tokenizer.model"), DATA,
                          str(batch), str(steps), str(seq_len)], capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def arithmetic(kind, shapes, warmup):
    """FLOPs of the measured steps: torchtune's (every layer and the output projection at every padded
    position) and ktune's: the layers at the samples' real tokens (ktune's default lays a batch's
    samples in one row without padding, src/data/padding_free.h) and the output projection only where there is a label
    (its fused loss skips the rest). Full: 6 per parameter per position (forward, input and weight
    gradients); LoRA: 4 (no weight gradient for the frozen base; the adapters' few FLOPs and
    attention's score arithmetic are left out of both)."""
    per = 6 if kind == "full" else 4
    head = SHAPE["vocab"] * SHAPE["dim"]
    layers = n_params() - head
    steps = shapes[warmup:]
    torchtune = sum(per * (layers + head) * s["positions"] for s in steps)
    ktune = sum(per * layers * s["tokens"] + per * head * s["labels"] for s in steps)
    return torchtune, ktune


def n_params():
    return SHAPE["vocab"] * SHAPE["dim"] + SHAPE["layers"] * (
        2 * SHAPE["dim"] * SHAPE["dim"] + 2 * SHAPE["dim"] * (SHAPE["dim"] // SHAPE["heads"]) * SHAPE["kv_heads"]
        + 3 * SHAPE["dim"] * SHAPE["hidden"])


def run(argv, env, log_path):
    """Runs argv; returns (wall seconds, peak RSS bytes of the process)."""
    start = time.time()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{' '.join(argv[:4])} failed; its output is in {log_path}:\n" + open(log_path).read()[-3000:])
    return time.time() - start, usage.ru_maxrss * 1024


STEP_LINE = re.compile(r"Step (\d+) \| (.*)")


def step_times(log_dir, warmup):
    """(step, tokens/s, loss) of each step after the warmup, from the DiskLogger's log_*.txt, and the first
    step's loss."""
    logs = [f for f in os.listdir(log_dir) if f.startswith("log_") and f.endswith(".txt")]
    if len(logs) != 1:
        sys.exit(f"expected one log_*.txt in {log_dir}, found {logs}")
    rows = []
    for line in open(os.path.join(log_dir, logs[0])):
        m = STEP_LINE.search(line)
        if not m:
            continue
        values = dict(kv.split(":", 1) for kv in m.group(2).split())
        if "tokens_per_second_per_gpu" not in values:  # a validation line
            continue
        rows.append((int(m.group(1)), float(values["tokens_per_second_per_gpu"]), float(values["loss"])))
    return rows[warmup:], rows[0][2] if rows else float("nan")


def gemm_ceiling(ktune_build, threads, dtype):
    """The best GEMM rate (GFLOP/s) bench/gemm measures now, at the same thread count, for the run's
    dtype: f32 GEMMs for fp32, bf16-operand GEMMs (f32 accumulation) for bf16."""
    exe = os.path.join(ktune_build, "bench", "gemm", "ktune_bench_gemm")
    if not os.path.exists(exe):
        return None
    with tempfile.NamedTemporaryFile(suffix=".json") as report:
        subprocess.run([exe, "--quick", "--json", report.name], capture_output=True, check=True,
                       env=dict(os.environ, KTUNE_NUM_THREADS=str(threads)))
        measured = json.load(open(report.name))
    if dtype == "bf16":
        return max((g["bf16_gflops"] for g in measured.get("gemm", [])), default=None)
    return measured.get("gemm_ceiling_gflops")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ktune", help="the ktune binary (required)")
    ap.add_argument("--tune", help="torchtune 0.6.1's `tune` in its own venv (required)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--kinds", default="full,lora")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"], help="both tools' dtype")
    ap.add_argument("--keep", help="keep the work directory here")
    ap.add_argument("--make-model", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.make_model:
        make_model(args.make_model, TOKENIZER_XZ)
        return
    if not args.ktune or not args.tune:
        ap.error("--ktune and --tune are required")
    if not os.path.exists(TOKENIZER_XZ):
        sys.exit(f"missing the Llama 3 tokenizer: {TOKENIZER_XZ}")

    work = args.keep or tempfile.mkdtemp(prefix="ktune_vs_torchtune_")
    os.makedirs(work, exist_ok=True)
    model_dir = os.path.join(work, "model")
    if not os.path.exists(os.path.join(model_dir, "model.safetensors")):
        # In a process of its own: a child's peak RSS (wait4) counts what it inherited at fork, and
        # this process would otherwise hold torch and the model when it starts the tools.
        subprocess.run([sys.executable, os.path.abspath(__file__), "--make-model", model_dir], check=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), KTUNE_NUM_THREADS=str(args.threads),
               MKL_NUM_THREADS=str(args.threads))
    print(f"model: Llama 3.2-style, vocab {SHAPE['vocab']}, dim {SHAPE['dim']}, {SHAPE['layers']} layers, "
          f"{n_params() / 1e6:.1f}M parameters (tied); batch {args.batch}, {args.dtype}, {args.threads} threads, "
          f"{args.steps} steps ({args.warmup} warm-up)")
    ceiling = gemm_ceiling(os.path.dirname(os.path.dirname(os.path.abspath(args.ktune))), args.threads, args.dtype)
    shapes = batch_shapes(args.tune, model_dir, args.batch, args.steps, args.seq_len)
    positions = sum(s["positions"] for s in shapes[args.warmup:])
    labels = sum(s["labels"] for s in shapes[args.warmup:])
    tokens = sum(s["tokens"] for s in shapes[args.warmup:])
    print(f"measured steps: {positions} padded positions, {tokens} of them sample tokens (ktune's padding-free "
          f"rows), {labels} with a label")

    results = {}
    for kind in args.kinds.split(","):
        recipe = "full_finetune_single_device" if kind == "full" else "lora_finetune_single_device"
        config = f"llama3_2/1B_{kind}_single_device"
        for tool, exe in (("torchtune", args.tune), ("ktune", args.ktune)):
            out_dir = os.path.join(work, f"{tool}_{kind}")
            shutil.rmtree(out_dir, ignore_errors=True)
            argv = [exe, "run", recipe, "--config", config] + overrides(kind, model_dir, out_dir, args.steps, args.batch,
                                                                       args.seq_len, tool, args.dtype)
            wall, rss = run(argv, env, os.path.join(work, f"{tool}_{kind}.log"))
            rows, first_loss = step_times(os.path.join(out_dir, "logs"), args.warmup)
            # Each step's seconds: its label tokens (the same data for both) over the logged rate.
            seconds = sum(shapes[step - 1]["labels"] / tps for step, tps, _ in rows)
            results[(kind, tool)] = dict(rows=rows, rss=rss, wall=wall, seconds=seconds, first_loss=first_loss)
        t, k = results[(kind, "torchtune")], results[(kind, "ktune")]
        print(f"{kind:4s} first step's loss: torchtune {t['first_loss']:.6f}, ktune {k['first_loss']:.6f} "
              f"(relative difference {abs(k['first_loss'] - t['first_loss']) / abs(t['first_loss']):.1e})")
        print(f"{kind:4s} torchtune {labels / t['seconds']:8.1f} tokens/s  peak RSS {t['rss'] / 2**20:7.0f} MiB  (wall {t['wall']:.0f} s)")
        print(f"{kind:4s} ktune     {labels / k['seconds']:8.1f} tokens/s  peak RSS {k['rss'] / 2**20:7.0f} MiB  (wall {k['wall']:.0f} s)")
        print(f"{kind:4s} ratio: ktune/torchtune speed {t['seconds'] / k['seconds']:.2f}x (target >= 3x), "
              f"memory {k['rss'] / t['rss']:.2f}x (target <= 0.6x)", flush=True)
        if ceiling:
            # What the speed ratio can be: torchtune's share of the GEMM ceiling, and the time ktune's
            # arithmetic would take at the ceiling itself.
            tt_flops, kt_flops = arithmetic(kind, shapes, args.warmup)
            tt_rate, kt_rate = tt_flops / t["seconds"] / 1e9, kt_flops / k["seconds"] / 1e9
            best = t["seconds"] / (kt_flops / 1e9 / ceiling)
            print(f"{kind:4s} {args.dtype} GEMM ceiling {ceiling:.0f} GFLOP/s: torchtune {tt_rate:.0f} GFLOP/s ({100 * tt_rate / ceiling:.0f}%), "
                  f"ktune {kt_rate:.0f} GFLOP/s ({100 * kt_rate / ceiling:.0f}%) on {100 * kt_flops / tt_flops:.0f}% of "
                  f"torchtune's arithmetic (its loss head skips unlabelled positions); the most any step doing "
                  f"ktune's arithmetic could reach here is {best:.2f}x", flush=True)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
