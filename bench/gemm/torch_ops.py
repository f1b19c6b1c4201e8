#!/usr/bin/env python3
"""PyTorch eager on the shapes ktune_bench_gemm measured, and the ratios.

    python3 torch_ops.py KTUNE_JSON [--quick] [--cpu-time]

Reads the JSON ktune_bench_gemm wrote, times the same operations in PyTorch eager with the same
thread count and clock (wall, or process CPU time as ktune used with --cpu-time) (torch.matmul; scaled_dot_product_attention, or HF Gemma2's eager attention where a
window/soft-cap is involved; logits + F.cross_entropy; HF-style RMSNorm, SwiGLU, GELU-tanh, RoPE;
torch.optim.AdamW), and prints both figures and ktune / torch for each. Times are best-of-N."""
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F


def threads():
    for name in ("KTUNE_NUM_THREADS", "OMP_NUM_THREADS"):
        v = os.environ.get(name)
        if v and int(v) > 0:
            return int(v)
    return os.cpu_count()


CLOCK = time.perf_counter


def best_time(fn, reps):
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = CLOCK()
        fn()
        best = min(best, CLOCK() - t0)
    return best


def gemm_gflops(M, K, N, dtype, seconds, cpu_time):
    x = torch.randn(M, K).to(dtype)
    w = torch.randn(N, K).to(dtype)
    if cpu_time:  # as ktune: best of short batches
        return 2.0 * M * N * K / best_time(lambda: torch.matmul(x, w.t()), max(3, int(seconds * 20))) / 1e9
    torch.matmul(x, w.t())
    n, t0 = 0, time.perf_counter()
    while True:
        torch.matmul(x, w.t())
        n += 1
        el = time.perf_counter() - t0
        if el >= seconds:
            break
    return 2.0 * M * N * K * n / el / 1e9


def attention_ms(c, reps):
    B, T, Hq, Hkv, D = c["B"], c["T"], c["Hq"], c["Hkv"], c["D"]
    window, cap = c["window"], c["softcap"]
    q = torch.randn(B, Hq, T, D, requires_grad=True)
    k = torch.randn(B, Hkv, T, D, requires_grad=True)
    v = torch.randn(B, Hkv, T, D, requires_grad=True)
    dout = torch.randn(B, Hq, T, D)
    scale = 0.125
    if window == 0 and cap == 0:
        def fwd():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=Hq != Hkv)
    else:
        # HF Gemma2 eager: repeat kv, scores, soft-cap, additive mask, softmax, @ v
        i = torch.arange(T)
        visible = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < (window if window else T + 1))
        mask = torch.zeros(T, T).masked_fill(~visible, float("-inf"))

        def fwd():
            kk = k.repeat_interleave(Hq // Hkv, dim=1)
            vv = v.repeat_interleave(Hq // Hkv, dim=1)
            s = torch.matmul(q, kk.transpose(2, 3)) * scale
            if cap:
                s = torch.tanh(s / cap) * cap
            p = torch.softmax(s + mask, dim=-1)
            return torch.matmul(p, vv)
    with torch.no_grad():
        t_fwd = best_time(fwd, reps)
    def fwd_bwd():
        q.grad = k.grad = v.grad = None
        fwd().backward(dout)
    t_all = best_time(fwd_bwd, reps)
    return t_fwd * 1e3, t_all * 1e3


def cross_entropy_ms(c, reps):
    N, C, V = c["N"], c["C"], c["V"]
    h = torch.randn(N, C, requires_grad=True)
    w = (torch.randn(V, C) * 0.05).requires_grad_()
    labels = torch.tensor([(i * 7919) % V for i in range(N)])
    def step():
        h.grad = w.grad = None
        loss = F.cross_entropy(h @ w.t(), labels, reduction="sum") / N
        loss.backward()
    return best_time(step, reps) * 1e3


def glue_ms(reps):
    N, C, I, H, D = 1024, 768, 3072, 12, 64
    out = {}
    x = torch.randn(N, C, requires_grad=True)
    w = torch.randn(C, requires_grad=True)
    dy = torch.randn(N, C)
    def rms():
        var = x.pow(2).mean(-1, keepdim=True)
        return w * (x * torch.rsqrt(var + 1e-5))
    def rms_fb():
        x.grad = w.grad = None
        rms().backward(dy)
    with torch.no_grad():
        out["rmsnorm forward"] = best_time(rms, reps)
    out["rmsnorm forward+backward"] = best_time(rms_fb, reps)
    g = (torch.randn(N, I) * 4).requires_grad_()
    u = torch.randn(N, I, requires_grad=True)
    d = torch.randn(N, I)
    for name, act in (("swiglu", F.silu), ("geglu_tanh", lambda t: F.gelu(t, approximate="tanh"))):
        with torch.no_grad():
            out[f"{name} forward"] = best_time(lambda: act(g) * u, reps)
        def fb():
            g.grad = u.grad = None
            (act(g) * u).backward(d)
        out[f"{name} forward+backward"] = best_time(fb, reps)
    # HF apply_rotary_pos_emb on (1, H, N, D)
    q = torch.randn(1, H, N, D)
    pos = torch.arange(N) % 256
    inv_freq = 1.0 / (500000.0 ** (torch.arange(0, D, 2).float() / D))
    emb = torch.cat([pos[:, None].float() * inv_freq[None, :]] * 2, dim=-1)
    cos, sin = emb.cos()[None, None], emb.sin()[None, None]
    def rot_half(t):
        return torch.cat((-t[..., D // 2:], t[..., : D // 2]), dim=-1)
    with torch.no_grad():
        out["rope forward (12 heads)"] = best_time(lambda: q * cos + rot_half(q) * sin, reps)
    P = 20_000_000
    p = torch.nn.Parameter(torch.randn(P))
    p.grad = torch.randn(P)
    opt = torch.optim.AdamW([p], lr=1e-4, weight_decay=0.01)
    out["adamw 20M params"] = best_time(opt.step, reps)
    return {k: v * 1e3 for k, v in out.items()}


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: torch_ops.py KTUNE_JSON [--quick]")
    quick = "--quick" in sys.argv
    reps = 3 if quick else 5
    k = json.load(open(sys.argv[1]))
    global CLOCK
    cpu_time = bool(k.get("cpu_time"))
    if cpu_time:
        CLOCK = time.process_time
    torch.set_num_threads(threads())
    print(f"\nPyTorch {torch.__version__} eager, {torch.get_num_threads()} threads (ktune: {k['threads']}), "
          f"{'process CPU' if cpu_time else 'wall'} time")
    print(f"\n{'gemm M x K x N':<20} {'ktune f32':>10} {'torch f32':>10} {'ratio':>7} {'ktune bf16':>11} {'torch bf16':>11} {'ratio':>7}   GFLOP/s")
    secs = 0.15 if quick else 0.4
    ratios = []
    for g in k["gemm"]:
        tf = gemm_gflops(g["M"], g["K"], g["N"], torch.float32, secs, cpu_time)
        tb = gemm_gflops(g["M"], g["K"], g["N"], torch.bfloat16, secs * 0.5, cpu_time)
        ratios.append(g["f32_gflops"] / tf)
        print(f"{g['M']}x{g['K']}x{g['N']:<10} {g['f32_gflops']:>10.1f} {tf:>10.1f} {g['f32_gflops'] / tf:>7.2f} "
              f"{g['bf16_gflops']:>11.1f} {tb:>11.1f} {g['bf16_gflops'] / tb:>7.2f}")
    print(f"gemm f32 ratio, geometric mean: {math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f}  "
          f"(ktune ceiling {k['gemm_ceiling_gflops']:.1f} GFLOP/s)")

    print(f"\n{'attention fwd+bwd':<36} {'ktune ms':>9} {'torch ms':>9} {'speedup':>8}   (fwd only: ktune / torch ms)")
    for a in k["attention"]:
        t_fwd, t_all = attention_ms(a, reps)
        kt = a["fwd_ms"] + a["bwd_ms"]
        print(f"{a['name']:<36} {kt:>9.1f} {t_all:>9.1f} {t_all / kt:>8.2f}   ({a['fwd_ms']:.1f} / {t_fwd:.1f})")

    print(f"\n{'linear+CE fwd+bwd (N, C, V)':<36} {'ktune ms':>9} {'torch ms':>9} {'speedup':>8}")
    for c in k["cross_entropy"]:
        t = cross_entropy_ms(c, 2 if quick else 3)
        print(f"{str((c['N'], c['C'], c['V'])):<36} {c['ms']:>9.1f} {t:>9.1f} {t / c['ms']:>8.2f}   "
              f"(torch materialises {c['N'] * c['V'] * 4 / 1e6:.0f} MB of logits, x2 with their gradient)")

    print(f"\n{'glue op':<36} {'ktune ms':>9} {'torch ms':>9} {'speedup':>8}")
    tg = glue_ms(reps * 2)
    kg = {g["name"]: g["ms"] for g in k["glue"]}
    pairs = [("rmsnorm forward", ["rmsnorm forward"]),
             ("rmsnorm forward+backward", ["rmsnorm forward", "rmsnorm backward"]),
             ("swiglu forward", ["swiglu forward"]),
             ("swiglu forward+backward", ["swiglu forward", "swiglu backward"]),
             ("geglu_tanh forward", ["geglu_tanh forward"]),
             ("geglu_tanh forward+backward", ["geglu_tanh forward", "geglu_tanh backward"]),
             ("rope forward (12 heads)", ["rope forward (12 heads)"]),
             ("adamw 20M params", ["adamw 20M params"])]
    for name, parts in pairs:
        kt = sum(kg[p] for p in parts)
        print(f"{name:<36} {kt:>9.3f} {tg[name]:>9.3f} {tg[name] / kt:>8.2f}")


if __name__ == "__main__":
    main()
