#!/usr/bin/env python3
"""The first optimizer steps of a LoRA and a DoRA fine-tune in PyTorch + PEFT, for
tests/train/peft_steps/peft_steps_test.cpp to repeat in ktune and compare step by step.

Run from anywhere:  python3 tests/train/peft_steps/make_peft_steps_fixture.py
Reads the HF parity fixture model tests/model/fixtures/llama (a 2-layer Llama 3 with tied
embeddings). Writes tests/train/peft_steps/{lora,dora}.safetensors. CPU, float32, eager attention.

Each file holds:
  tokens, labels             (B, T) int64 — labels already aligned (label[b, t] is the target of
                             position t); -100 marks ignored positions
  init.<peft name>           the adapter before the first step (B is made non-zero, so that every
                             adapter gradient matters from step 0)
  loss.<k>                   () the token-mean cross-entropy at step k (before its update)
  grad.<k>.<peft name>       its gradient with respect to each adapter parameter, at step k
  final.<peft name>          the adapter after STEPS AdamW updates
  settings                   (6,) lr, beta1, beta2, eps, weight_decay, scale (alpha / r)
The training step is the trainer's: loss = Σ CE / n_valid, backward, torch.optim.AdamW.step().
PEFT names are those of adapter_model.safetensors ("base_model.model.<module>.lora_A.weight").
"""
import os

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL_DIR = os.path.join(HERE, "..", "..", "model", "fixtures", "llama")
B, T, STEPS = 2, 16, 3
RANK, ALPHA = 4, 8.0
LR, BETAS, EPS, WEIGHT_DECAY = 1e-2, (0.9, 0.999), 1e-8, 0.01
TARGETS = ["q_proj", "v_proj", "o_proj", "gate_proj", "down_proj"]


def batch(vocab):
    g = torch.Generator().manual_seed(1234)
    tokens = torch.randint(0, vocab, (B, T), generator=g)
    labels = torch.roll(tokens, -1, dims=1).clone()
    labels[:, -1] = -100
    labels[0, :3] = -100  # a masked prompt
    labels[1, 10:] = -100  # a padded tail
    return tokens, labels


def run(use_dora):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.float32, attn_implementation="eager")
    config = LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=TARGETS, use_dora=use_dora)
    model = get_peft_model(model, config)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    model.train()
    tokens, labels = batch(model.config.vocab_size)

    out = {"tokens": tokens, "labels": labels}
    for name, value in get_peft_model_state_dict(model).items():
        out["init." + name] = value.detach().clone()
    # state-dict name (with ".default") -> PEFT file name
    live = {n: p for n, p in model.named_parameters() if p.requires_grad}
    saved_names = {}
    for n in live:
        saved = n.replace(".default", "")
        if saved.endswith("lora_magnitude_vector.weight"):
            saved = saved[: -len(".weight")]  # PEFT saves the magnitude without ".weight"
        saved_names[n] = saved
    assert all(v in {k[5:] for k in out if k.startswith("init.")} for v in saved_names.values()), saved_names

    optimizer = torch.optim.AdamW(live.values(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)
    for step in range(STEPS):
        optimizer.zero_grad()
        logits = model(input_ids=tokens).logits  # (B, T, V)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                                 ignore_index=-100, reduction="mean")
        loss.backward()
        out[f"loss.{step}"] = loss.detach().clone()
        for n, p in live.items():
            out[f"grad.{step}.{saved_names[n]}"] = p.grad.detach().clone()
        optimizer.step()
    for name, value in get_peft_model_state_dict(model).items():
        out["final." + name] = value.detach().clone()
    out["settings"] = torch.tensor([LR, BETAS[0], BETAS[1], EPS, WEIGHT_DECAY, ALPHA / RANK], dtype=torch.float32)
    return {k: v.contiguous() for k, v in out.items()}


if __name__ == "__main__":
    for name, dora in (("lora", False), ("dora", True)):
        path = os.path.join(HERE, name + ".safetensors")
        save_file(run(dora), path)
        print("wrote", path)
