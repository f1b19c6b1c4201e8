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


def ktune_rates(binary, seconds):
    proc = subprocess.run([binary, f"--seconds={seconds}"], capture_output=True, text=True, timeout=300)
    sys.stdout.write(proc.stdout if proc.returncode != 0 else "")
    if proc.returncode == 77:
        return None
    if proc.returncode != 0:
        sys.stdout.write(proc.stderr)
        raise SystemExit(f"ktune_gpu_gemm_bench failed with exit code {proc.returncode}")
    rates = {}
    for line in proc.stdout.splitlines():
        if line.startswith("device:"):
            print(line)
        parts = line.split()
        if len(parts) == 5 and parts[0] == "ktune_gemm":
            rates[tuple(int(p) for p in parts[1:4])] = float(parts[4])
    return rates


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
    rates = ktune_rates(sys.argv[1], seconds)
    if rates is None:
        print("SKIP gpu gemm benchmark: no CUDA device")
        return 0
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
