#!/usr/bin/env python3
"""ktune's GPU training step beside PyTorch's on the same GPU, in the same run.

  train_step_compare.py BUILD/bench/gpu/ktune_gpu_train_step_bench [--modes lora,full] [--batch 4]
                        [--seq 2048] [--steps 6] [--warmup 2] [--max-seconds 20] [--timeout 120]

For each mode (lora: torchtune's llama3_2/1B_lora_single_device adapters, rank 64, alpha 128 on
q_proj, v_proj, o_proj and the MLP; full: every parameter), it runs the ktune binary, then the same
step in PyTorch — a Llama-3.2-1B-shaped transformers LlamaForCausalLM (random weights, bf16,
attn_implementation="sdpa", tied embeddings), PEFT LoRA with the same targets (adapters kept in
bf16), torch.optim.AdamW (fused) — each in its own subprocess with a timeout, so that a crash or a
hang in one leaves the others running. Prints a table (tokens/s, step ms, MFU against 990 TFLOP/s
with ktune's FLOP count, peak memory) and ktune/torch ratios, and one summary line per mode:
  SUMMARY mode=lora ktune_tokens_per_s=... torch_tokens_per_s=... ratio=... ktune_mfu=... ...
Exit code: 0 when every part ran; 1 when some part failed (the table says which); 77 without a GPU.
ktune runs with --attention=auto (as the recipes: every attention kernel timed on one layer, the
fastest that agrees with the others taken; the binary prints the trials) unless told otherwise; when
that part fails it is rerun once with the tiled CUDA-core kernel (--attention=flash), and the failure
is still reported. --also-attention K reruns the LoRA step with K, unless the first run ran K.
Memory: ktune's figure is its planned arenas (parameters, gradients, AdamW state, activations, loss
scratch) and the driver's in-use total; torch's is max_memory_allocated and max_memory_reserved.
It deliberately runs random tokens: the step's speed, not a training result.

  train_step_compare.py BINARY --memory-check [--timeout 120]
runs ktune alone at the settings torchtune publishes its peak memory for (Llama 3.2 3B, batch 2 x
seq 4096, activation checkpointing and offloading, as torchtune's table of memory optimisations
measures them; LoRA 8.5 GiB, QLoRA 4.6 GiB, the issue's figures; the fused tensor-core attention,
the GEMM path if that fails) and prints
one MEMORY line per mode: ktune's planned arenas and what the run allocated on the device (the
driver's in-use count after the warm-up step minus before the model: arenas, cuBLASLt workspace),
each against the published figure.
"""
import argparse
import os
import subprocess
import sys
import time

PEAK_TFLOPS = 990.0  # H200 SXM, dense bf16
LORA_TARGETS = ["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def parse_result(text):
    for line in text.splitlines():
        if line.startswith("RESULT "):
            out = {}
            for kv in line.split()[1:]:
                k, _, v = kv.partition("=")
                out[k] = v
            return out
    return None


def run_part(cmd, timeout):
    """Runs one part; returns (result dict or None, exit code, output)."""
    start = time.time()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        out = proc.stdout + (("\n[stderr]\n" + proc.stderr[-4000:]) if proc.stderr.strip() else "")
        rc = proc.returncode
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        out += f"\n[timed out after {timeout} s]"
        rc = 124
    sys.stdout.write(f"--- {' '.join(cmd[:2])} {' '.join(cmd[2:])} ({time.time() - start:.0f} s, exit {rc})\n")
    for line in out.splitlines():
        sys.stdout.write("    " + line + "\n")
    sys.stdout.flush()
    return (parse_result(out) if rc == 0 else None), rc, out


# ---------------------------------------------------------------------------------------------
# The PyTorch side (run as a subprocess of this script: --torch-worker MODE)

def torch_worker(args):
    import torch
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM

    cuda = args.torch_device == "cuda"
    if cuda and not torch.cuda.is_available():
        print("SKIP torch: no CUDA device")
        return 77
    dev = torch.device(args.torch_device)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    cfg = LlamaConfig(
        vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=args.layers,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=131072,
        rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True, attention_bias=False, mlp_bias=False,
        rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 8192},
    )
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    with dev:
        model = LlamaForCausalLM(cfg)
    torch.set_default_dtype(prev)
    model.to(dtype=torch.bfloat16)
    model.config.use_cache = False
    model.train()
    if args.torch_worker == "lora":
        import peft
        lcfg = peft.LoraConfig(r=64, lora_alpha=128, lora_dropout=0.0, target_modules=LORA_TARGETS, bias="none")
        try:
            model = peft.get_peft_model(model, lcfg, autocast_adapter_dtype=False)  # adapters in bf16, as ktune
        except TypeError:
            model = peft.get_peft_model(model, lcfg)
        for p in model.parameters():
            if p.requires_grad and p.dtype != torch.bfloat16:
                p.data = p.data.to(torch.bfloat16)
    trainable = [p for p in model.parameters() if p.requires_grad]
    lr = 2e-5 if args.torch_worker == "full" else 3e-4
    try:
        opt = torch.optim.AdamW(trainable, lr=lr, weight_decay=0.01, fused=True)
    except Exception:
        opt = torch.optim.AdamW(trainable, lr=lr, weight_decay=0.01)
    g = torch.Generator(device="cpu").manual_seed(42)
    ids = torch.randint(0, 128256, (args.batch, args.seq), generator=g).to(dev)
    attn_impl = getattr(model.config, "_attn_implementation", "?")
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, attention {attn_impl}, "
          f"parameters {sum(p.numel() for p in model.parameters())}, trainable {sum(p.numel() for p in trainable)}")
    sys.stdout.flush()

    losses = []

    def step():
        out = model(input_ids=ids, labels=ids)  # HF shifts the labels: T-1 targets a row, as ktune
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(out.loss.detach())

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    for i in range(args.warmup):
        t0 = time.time()
        step()
        sync()
        print(f"warm-up step {i + 1}: {1000 * (time.time() - t0):.1f} ms, loss {losses[-1].item():.4f}")
        sys.stdout.flush()
    timed = 0
    start = time.time()
    while timed < args.steps:
        step()
        timed += 1
        sync()
        if time.time() - start > args.max_seconds:
            break
    seconds = time.time() - start
    tokens = args.batch * args.seq * timed
    print(f"RESULT side=torch mode={args.torch_worker} batch={args.batch} seq={args.seq} steps={timed} "
          f"step_ms={1000 * seconds / timed:.2f} tokens_per_s={tokens / seconds:.1f} "
          f"loss_first={losses[0].item():.4f} loss_last={losses[-1].item():.4f} "
          f"max_allocated_gib={(torch.cuda.max_memory_allocated() if cuda else 0) / 2**30:.3f} "
          f"max_reserved_gib={(torch.cuda.max_memory_reserved() if cuda else 0) / 2**30:.3f}")
    return 0


# ---------------------------------------------------------------------------------------------
# Peak memory against torchtune's published figures (ktune only)

TORCHTUNE_PUBLISHED_GIB = {"lora": 8.5, "qlora": 4.6}  # Llama 3.2 3B, batch 2 x seq 4096


def memory_check(binary, timeout):
    """torchtune's table measures these with activation checkpointing and offloading (and a fused
    attention): ktune runs the same, with its fused tensor-core attention, and again with the GEMM
    attention path should that one fail."""
    failed = []
    for mode, published in TORCHTUNE_PUBLISHED_GIB.items():
        common = [binary, "--model=3b", f"--mode={mode}", "--batch=2", "--seq=4096", "--activation-checkpointing=1",
                  "--activation-offloading=1", "--steps=1", "--warmup=1", "--max-seconds=10"]
        attention = "tensor_core"
        k, rc, _ = run_part(common + [f"--attention={attention}"], timeout)
        if rc == 77:
            print("SKIP gpu memory check: no CUDA device")
            return 77
        if k is None:
            print(f"MEMORY model=3b mode={mode} attention=tensor_core ktune=FAILED (exit {rc}); again with gemm")
            attention = "gemm"
            k, rc, _ = run_part(common + [f"--attention={attention}"], timeout)
        if k is None:
            failed.append(mode)
            print(f"MEMORY model=3b mode={mode} ktune=FAILED (exit {rc})")
            continue
        planned, used = float(k["planned_gib"]), float(k["run_used_gib"])
        print(f"MEMORY model=3b mode={mode} batch=2 seq=4096 activation_checkpointing=1 activation_offloading=1 "
              f"attention={attention} ktune_planned_gib={planned:.2f} ktune_run_used_gib={used:.2f} "
              f"torchtune_published_gib={published} ratio={used / published:.2f} "
              f"target={'met' if used < published else 'MISSED'}")
    return 1 if failed else 0


# ---------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary", nargs="?")
    ap.add_argument("--modes", default="lora,full")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--max-seconds", type=float, default=20)
    ap.add_argument("--timeout", type=float, default=120, help="seconds for each part (ktune or torch, each mode)")
    ap.add_argument("--attention", default="auto", choices=["auto", "gemm", "flash", "tensor_core"],
                    help="ktune's attention kernels (auto: timed on the GPU, as the recipes choose)")
    ap.add_argument("--also-attention", default="", choices=["", "gemm", "flash", "tensor_core"],
                    help="run ktune's LoRA step once more with these attention kernels (an extra row)")
    ap.add_argument("--memory-check", action="store_true",
                    help="ktune alone at torchtune's published memory settings (3B, batch 2 x 4096, "
                         "checkpointing + offloading)")
    ap.add_argument("--torch-worker", choices=["lora", "full"])
    ap.add_argument("--torch-device", default="cuda", help="cpu: a smoke test of the PyTorch side only")
    args = ap.parse_args()
    if args.torch_worker:
        return torch_worker(args)
    if not args.binary:
        ap.error("the ktune_gpu_train_step_bench binary is required")
    if args.memory_check:
        return memory_check(args.binary, args.timeout)

    common = [f"--batch={args.batch}", f"--seq={args.seq}", f"--layers={args.layers}", f"--steps={args.steps}",
              f"--warmup={args.warmup}", f"--attention={args.attention}"]
    rows, failed = [], []
    for mode in [m for m in args.modes.split(",") if m]:
        k, krc, _ = run_part([args.binary, f"--mode={mode}", *common, f"--max-seconds={int(args.max_seconds)}"],
                             args.timeout)
        if krc == 77:
            print("SKIP gpu train-step benchmark: no CUDA device")
            return 77
        if k is None and args.attention != "flash" and krc != 124:  # (a timeout leaves no time to retry)
            # The tensor-core attention paths are the newest part: fall back to the tiled kernel so
            # the rest of the step still gets measured (and say so).
            failed.append(f"ktune {mode} with {args.attention} attention (exit {krc})")
            fallback = [c.replace(f"--attention={args.attention}", "--attention=flash") for c in common]
            k, krc, _ = run_part([args.binary, f"--mode={mode}", *fallback, f"--max-seconds={int(args.max_seconds)}"],
                                 args.timeout)
        if k is None:
            failed.append(f"ktune {mode} (exit {krc})")
        t, trc, _ = run_part([sys.executable, os.path.abspath(__file__), f"--torch-worker={mode}",
                              f"--batch={args.batch}", f"--seq={args.seq}", f"--layers={args.layers}",
                              f"--steps={args.steps}", f"--warmup={args.warmup}",
                              f"--max-seconds={args.max_seconds}"], args.timeout)
        if t is None:
            failed.append(f"torch {mode} (exit {trc})")
        rows.append((mode, k, t))
    extra = None  # (attention, the LoRA step's RESULT with --also-attention)
    lora_ran = next((k.get("attention") for mode, k, _ in rows if mode == "lora" and k), args.attention)
    if args.also_attention and args.also_attention != lora_ran and "lora" in args.modes.split(","):
        other = [c.replace(f"--attention={args.attention}", f"--attention={args.also_attention}") for c in common]
        x, xrc, _ = run_part([args.binary, "--mode=lora", *other, f"--max-seconds={int(args.max_seconds)}"], args.timeout)
        if x is None:
            failed.append(f"ktune lora with {args.also_attention} attention (exit {xrc})")
        extra = (args.also_attention, x)

    print()
    print(f"training step, Llama-3.2-1B shape, batch {args.batch} x seq {args.seq}, bf16, "
          f"MFU vs {PEAK_TFLOPS:.0f} TFLOP/s (H200 dense bf16)")
    print(f"{'mode':<5} {'side':<6} {'tokens/s':>10} {'step ms':>9} {'TFLOP/s':>8} {'MFU':>6} {'memory GiB':>28}  loss")
    for mode, k, t in rows:
        fpt = float(k["flops_per_token"]) if k else None
        if k:
            print(f"{mode:<5} {'ktune':<6} {float(k['tokens_per_s']):>10.0f} {float(k['step_ms']):>9.1f} "
                  f"{float(k['tflops']):>8.1f} {100 * float(k['mfu']):>5.1f}% "
                  f"{'planned ' + k['planned_gib'] + ', in use ' + k['device_used_gib']:>28}  "
                  f"{k['loss_first']} -> {k['loss_last']}")
        else:
            print(f"{mode:<5} {'ktune':<6} {'FAILED':>10}")
        if extra and mode == "lora":
            x = extra[1]
            side = "ktune-" + ("tc" if extra[0] == "tensor_core" else extra[0])
            if x:
                print(f"{mode:<5} {side:<6} {float(x['tokens_per_s']):>10.0f} {float(x['step_ms']):>9.1f} "
                      f"{float(x['tflops']):>8.1f} {100 * float(x['mfu']):>5.1f}% "
                      f"{'planned ' + x['planned_gib'] + ', in use ' + x['device_used_gib']:>28}  "
                      f"{x['loss_first']} -> {x['loss_last']}")
            else:
                print(f"{mode:<5} {side:<6} {'FAILED':>10}")
        if t:
            tps = float(t["tokens_per_s"])
            tfl = f"{tps * fpt / 1e12:>8.1f} {100 * tps * fpt / 1e12 / PEAK_TFLOPS:>5.1f}%" if fpt else f"{'-':>8} {'-':>6}"
            print(f"{mode:<5} {'torch':<6} {tps:>10.0f} {float(t['step_ms']):>9.1f} {tfl} "
                  f"{'alloc ' + t['max_allocated_gib'] + ', resv ' + t['max_reserved_gib']:>28}  "
                  f"{t['loss_first']} -> {t['loss_last']}")
        else:
            print(f"{mode:<5} {'torch':<6} {'FAILED':>10}")
    for mode, k, t in rows:
        parts = [f"SUMMARY mode={mode}"]
        if k:
            parts += [f"ktune_attention={k.get('attention', '?')}",
                      f"ktune_tokens_per_s={float(k['tokens_per_s']):.0f}", f"ktune_mfu={100 * float(k['mfu']):.1f}%",
                      f"ktune_planned_gib={k['planned_gib']}", f"ktune_device_used_gib={k['device_used_gib']}"]
            if "attention_ms" in k and float(k.get("fwd_bwd_ms", 0)) > 0:
                parts.append(f"ktune_attention_share={100 * float(k['attention_ms']) / float(k['fwd_bwd_ms']):.0f}%")
            if "gemm_calls" in k:  # host-bound when the GEMM calls' host time (queue held open) nears the step's
                parts += [f"ktune_gemm_calls={k['gemm_calls']}", f"ktune_backward_host_ms={k['backward_host_ms']}",
                          f"ktune_backward_device_ms={k['backward_device_ms']}"]
            if "gemm_call_us" in k:
                parts += [f"ktune_gemm_call_us={k['gemm_call_us']}", f"ktune_kernel_launch_us={k['kernel_launch_us']}",
                          f"ktune_gemm_host_ms={k['gemm_host_ms']}"]
        else:
            parts.append("ktune=FAILED")
        if t:
            parts += [f"torch_tokens_per_s={float(t['tokens_per_s']):.0f}",
                      f"torch_max_allocated_gib={t['max_allocated_gib']}"]
        else:
            parts.append("torch=FAILED")
        if k and t:
            parts += [f"speed_ratio={float(k['tokens_per_s']) / float(t['tokens_per_s']):.2f}",
                      f"memory_ratio={float(k['planned_gib']) / max(float(t['max_allocated_gib']), 1e-9):.2f}"]
        print(" ".join(parts))
        if extra and mode == "lora" and extra[1] and t:
            x = extra[1]
            print(f"SUMMARY mode=lora ktune_attention={extra[0]} ktune_tokens_per_s={float(x['tokens_per_s']):.0f} "
                  f"ktune_mfu={100 * float(x['mfu']):.1f}% "
                  f"speed_ratio={float(x['tokens_per_s']) / float(t['tokens_per_s']):.2f}")
    if failed:
        print("FAILED parts: " + ", ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
