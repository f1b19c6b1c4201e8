#!/usr/bin/env python3
"""ktune's cuBLASLt GEMM against torch.matmul on the same GPU, in the same run.

Runs the ktune_gpu_gemm_bench binary (argv[1]), then times torch.matmul on the same bf16 shapes
with CUDA events, and prints a table: TFLOP/s of each, their share of the H200's 990 TFLOP/s
dense bf16 peak, and ktune / torch. Without a GPU, or without torch, it says so and skips that side.
It deliberately measures GEMMs only; the training-step benchmark is a separate one.
"""
import subprocess
import sys

PEAK_TFLOPS = 990.0  # H200 SXM, dense bf16
FAILED = False  # set when the ktune binary failed or printed an ERROR line: exit 1 after the table


def torch_attention_ms(torch, B, T, Hq, Hkv, D):
    """Forward and backward ms of torch's fused causal attention (GQA) at the same shape, bf16."""
    import torch.nn.functional as F
    q = torch.full((B, Hq, T, D), 0.0115, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    k = torch.full((B, Hkv, T, D), 0.0115, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    v = torch.full((B, Hkv, T, D), 0.0115, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    dout = torch.full((B, Hq, T, D), 0.0115, dtype=torch.bfloat16, device="cuda")

    def fwd():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.125, enable_gqa=True)

    def step():
        fwd().backward(dout)

    def timed(fn, reps=5):
        fn()
        torch.cuda.synchronize()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop) / reps

    with torch.no_grad():
        fwd_ms = timed(fwd)
    total_ms = timed(step)
    return fwd_ms, total_ms - fwd_ms


def ktune_rates(binary, seconds):
    global FAILED
    proc = subprocess.run([binary, f"--seconds={seconds}"], capture_output=True, text=True, timeout=300)
    sys.stdout.write(proc.stdout if proc.returncode != 0 else "")
    if proc.returncode == 77:
        return None
    if proc.returncode != 0:  # keep what it measured before it failed
        sys.stdout.write(proc.stderr)
        print(f"ktune_gpu_gemm_bench failed with exit code {proc.returncode}")
        FAILED = True
    for line in proc.stdout.splitlines():
        if line.startswith("ERROR"):
            print(line)
            FAILED = True
    rates, attention, attention_gemm, attention_tc, nf4 = {}, None, None, None, None
    for line in proc.stdout.splitlines():
        if line.startswith("device:"):
            print(line)
        parts = line.split()
        if len(parts) == 5 and parts[0] == "ktune_gemm":
            rates[tuple(int(p) for p in parts[1:4])] = float(parts[4])
        if len(parts) == 9 and parts[0] == "ktune_attention":
            attention = (tuple(int(p) for p in parts[1:6]), float(parts[6]), float(parts[7]), float(parts[8]))
        if len(parts) == 9 and parts[0] == "ktune_attention_gemm":
            attention_gemm = (float(parts[6]), float(parts[7]), float(parts[8]))
        if len(parts) == 9 and parts[0] == "ktune_attention_tc":
            attention_tc = (float(parts[6]), float(parts[7]), float(parts[8]))
        if len(parts) == 8 and parts[0] == "ktune_nf4":
            nf4 = tuple(int(p) for p in parts[1:4]) + tuple(float(p) for p in parts[4:8])
    return rates, attention, attention_gemm, attention_tc, nf4


def torch_rate(torch, M, N, K, seconds):
    a = torch.full((M, K), 0.0078125, dtype=torch.bfloat16, device="cuda")
    b = torch.full((K, N), 0.0078125, dtype=torch.bfloat16, device="cuda")
    c = torch.empty((M, N), dtype=torch.bfloat16, device="cuda")
    for _ in range(3):
        torch.matmul(a, b, out=c)
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        torch.matmul(a, b, out=c)
    stop.record()
    stop.synchronize()
    per = start.elapsed_time(stop) / 10.0
    iters = max(10, int(seconds * 1000.0 / max(per, 1e-3)))
    start.record()
    for _ in range(iters):
        torch.matmul(a, b, out=c)
    stop.record()
    stop.synchronize()
    ms = start.elapsed_time(stop)
    del a, b, c
    return 2.0 * M * N * K * iters / (ms * 1e-3) / 1e12


def main():
    if len(sys.argv) < 2:
        raise SystemExit("usage: gemm_compare.py BUILD/bench/gpu/ktune_gpu_gemm_bench [seconds]")
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
    result = ktune_rates(sys.argv[1], seconds)
    if result is None:
        print("SKIP gpu gemm benchmark: no CUDA device")
        return 0
    rates, attention, attention_gemm, attention_tc, nf4 = result
    try:
        import torch
        have_torch = torch.cuda.is_available()
        why = "" if have_torch else "torch sees no CUDA device"
    except ImportError as e:
        have_torch, why = False, f"torch not importable ({e})"
    if not have_torch:
        print(f"torch.matmul side skipped: {why}")
    print(f"{'M':>6} {'N':>7} {'K':>6} | {'ktune TFLOP/s':>13} {'% peak':>7} | {'torch TFLOP/s':>13} {'% peak':>7} | ktune/torch")
    for (M, N, K), k in rates.items():
        if have_torch:
            t = torch_rate(torch, M, N, K, seconds)
            print(f"{M:>6} {N:>7} {K:>6} | {k:>13.1f} {100 * k / PEAK_TFLOPS:>6.1f}% | {t:>13.1f} "
                  f"{100 * t / PEAK_TFLOPS:>6.1f}% | {k / t:.2f}")
        else:
            print(f"{M:>6} {N:>7} {K:>6} | {k:>13.1f} {100 * k / PEAK_TFLOPS:>6.1f}% | {'-':>13} {'-':>7} | -")
    print(f"(peak: {PEAK_TFLOPS:.0f} TFLOP/s dense bf16, H200)")
    if attention:
        (B, T, Hq, Hkv, D), fwd, bwd, tflops = attention
        line = (f"attention B={B} T={T} Hq={Hq} Hkv={Hkv} D={D} causal bf16: ktune tiled fwd {fwd:.2f} ms bwd {bwd:.2f} ms "
                f"({tflops:.1f} TFLOP/s, {100 * tflops / PEAK_TFLOPS:.1f}% peak)")
        if attention_gemm:
            gf, gb, gt = attention_gemm
            line += f"; ktune gemm-path fwd {gf:.2f} ms bwd {gb:.2f} ms ({gt:.1f} TFLOP/s)"
        if attention_tc:
            cf, cb, ct = attention_tc
            line += f"; ktune fused tc fwd {cf:.2f} ms bwd {cb:.2f} ms ({ct:.1f} TFLOP/s)"
        if have_torch:
            try:
                tf, tb = torch_attention_ms(torch, B, T, Hq, Hkv, D)
                line += f"; torch sdpa fwd {tf:.2f} ms bwd {tb:.2f} ms; ktune/torch time tiled {(fwd + bwd) / (tf + tb):.1f}x"
                if attention_gemm:
                    line += f", gemm-path {(attention_gemm[0] + attention_gemm[1]) / (tf + tb):.1f}x"
                if attention_tc:
                    line += f", fused tc {(attention_tc[0] + attention_tc[1]) / (tf + tb):.1f}x"
            except Exception as e:  # an older torch without enable_gqa, say
                line += f"; torch sdpa failed: {e}"
        print(line)
    if nf4:  # QLoRA's GEMMs on an NF4 W: dequantise + cuBLASLt, or fused (the decoder's KTUNE_CUDA_NF4_GEMM)
        M, out, inp, pf, ff, pb, fb = nf4
        flops = 2.0 * M * out * inp
        print(f"nf4 gemm M={M} W {out}x{inp} bf16 out: dequantise+cuBLASLt fwd {pf:.3f} ms bwd {pb:.3f} ms "
              f"({flops / (pf * 1e-3) / 1e12:.0f}/{flops / (pb * 1e-3) / 1e12:.0f} TFLOP/s); fused fwd {ff:.3f} ms "
              f"bwd {fb:.3f} ms ({flops / (ff * 1e-3) / 1e12:.0f}/{flops / (fb * 1e-3) / 1e12:.0f} TFLOP/s); "
              f"fused/plain time fwd {ff / pf:.2f}x bwd {fb / pb:.2f}x (< 1: KTUNE_CUDA_NF4_GEMM=fused pays)")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
