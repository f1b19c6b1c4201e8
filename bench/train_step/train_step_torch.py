#!/usr/bin/env python3
"""The peer of ktune_bench_train_step: the same Llama-shaped model in PyTorch eager (HF transformers
LlamaForCausalLM, SDPA attention, float32), the same batch shapes, thread count and AdamW, timing
full training steps (forward, backward, optimizer). Modes as in the C++ benchmark: "full" trains
every parameter; "frozen" trains only the RMSNorm weights (activation gradients through every layer,
no weight-gradient GEMMs for the frozen weights).

Prints one line per configuration and writes {"full": {"B": tokens_per_s}, "frozen": {...}} to --json.
"""
import argparse
import json
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", default="1,2,4")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--modes", default="full,frozen")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--intermediate", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
                         num_hidden_layers=args.layers, num_attention_heads=args.heads,
                         num_key_value_heads=args.heads, max_position_embeddings=8192, rms_norm_eps=1e-5,
                         rope_theta=500000.0, tie_word_embeddings=False)
    model = LlamaForCausalLM._from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"torch train_step: llama-shaped {n_params / 1e6:.1f}M parameters, T={args.seq}, f32, "
          f"{torch.get_num_threads()} threads, AdamW, torch {torch.__version__}", flush=True)
    results = {}
    for mode in args.modes.split(","):
        for name, p in model.named_parameters():
            p.requires_grad_(mode == "full" or "norm" in name)
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=1e-5, weight_decay=0.01)
        results[mode] = {}
        for B in [int(b) for b in args.batch.split(",")]:
            g = torch.Generator().manual_seed(12345)
            tokens = torch.randint(0, args.vocab, (B, args.seq), generator=g)
            labels = tokens.clone()  # HF shifts labels inside the loss

            def step():
                opt.zero_grad(set_to_none=True)
                loss = model(input_ids=tokens, labels=labels).loss
                loss.backward()
                opt.step()
                return loss.item()

            step()  # warm-up
            t0 = time.perf_counter()
            for _ in range(args.steps):
                step()
            dt = (time.perf_counter() - t0) / args.steps
            tps = B * args.seq / dt
            results[mode][str(B)] = tps
            print(f"torch train_step {mode:<6} B={B} T={args.seq}: {tps:.1f} tokens/s, {dt:.3f} s/step", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f)


if __name__ == "__main__":
    main()
