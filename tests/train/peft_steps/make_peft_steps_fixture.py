#!/usr/bin/env python3
"""The first optimizer steps of LoRA and DoRA fine-tunes in PyTorch + PEFT, for
tests/train/peft_steps/peft_steps_test.cpp to repeat in ktune and compare step by step.

Run from anywhere:  python3 tests/train/peft_steps/make_peft_steps_fixture.py
Reads the HF parity fixture model tests/model/fixtures/llama (a 2-layer Llama 3 with tied
embeddings) and writes, beside this script:
  untied_llama/               the same model with its own output layer (lm_head, random), for LoRA
                              on the output projection (PEFT module "lm_head")
  lora.safetensors, dora.safetensors                    dropout 0, attention + MLP targets
  lora_dropout.safetensors, dora_dropout.safetensors    dropout 0.25, same targets
  lora_head_dropout.safetensors                         untied model, + lm_head, dropout 0.25
  dora_head.safetensors                                 untied model, + lm_head, DoRA, dropout 0
  dora_head_dropout.safetensors                         untied model, + lm_head, DoRA, dropout 0.25
CPU, float32, eager attention.

Dropout: PEFT's lora_dropout modules are replaced by one that applies ktune's mask
(src/model/adapters/lora_adapter.cpp): element i of the flattened (B*T, in) input of module M is
dropped at step k when uniform01(splitmix64(SEED ^ splitmix64(k) ^ fnv1a64(M)), i) < p, kept ones
scaled by 1 / (1 - p) (float32). Both sides then drop the same elements.

Each file holds:
  tokens, labels             (B, T) int64 — labels already aligned (label[b, t] is the target of
                             position t); -100 marks ignored positions
  init.<peft name>           the adapter before the first step (B is made non-zero, so that every
                             adapter gradient matters from step 0)
  loss.<k>                   () the token-mean cross-entropy at step k (before its update)
  grad.<k>.<peft name>       its gradient with respect to each adapter parameter, at step k
  final.<peft name>          the adapter after STEPS AdamW updates
  settings                   (8,) lr, beta1, beta2, eps, weight_decay, scale (alpha / r), dropout p,
                             mask seed (the dropout key of step k is k)
  targets                    (M,) uint8: the PEFT target_modules joined by ',' (ASCII)
The training step is the trainer's: loss = Σ CE / n_valid, backward, torch.optim.AdamW.step().
PEFT names are those of adapter_model.safetensors ("base_model.model.<module>.lora_A.weight").
"""
import json
import os
import shutil

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL_DIR = os.path.join(HERE, "..", "..", "model", "fixtures", "llama")
UNTIED_DIR = os.path.join(HERE, "untied_llama")
B, T, STEPS = 2, 16, 3
RANK, ALPHA = 4, 8.0
LR, BETAS, EPS, WEIGHT_DECAY = 1e-2, (0.9, 0.999), 1e-8, 0.01
TARGETS = ["q_proj", "v_proj", "o_proj", "gate_proj", "down_proj"]
SEED = 17  # LoraOptions::seed on the ktune side

M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def splitmix64(x):
    x = np.asarray(x, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def fnv1a64(s):
    h = 0xCBF29CE484222325
    for c in s.encode():
        h ^= c
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return np.uint64(h)


def dropped(module, key, n, p):
    """ktune's mask: True where element i < n of the module's input is dropped at this key."""
    seed = splitmix64(np.uint64(SEED) ^ splitmix64(np.uint64(key)) ^ fnv1a64(module))
    u = (splitmix64(seed ^ splitmix64(np.arange(n, dtype=np.uint64))) >> np.uint64(40)).astype(np.float64) / 16777216.0
    return u < float(np.float32(p))


class KtuneMaskDropout(torch.nn.Module):
    """Stands in for PEFT's nn.Dropout: ktune's mask for this module and the current step's key."""

    def __init__(self, module, p, state):
        super().__init__()
        self.module, self.p, self.state = module, p, state
        self.keep_scale = float(np.float32(1.0) / (np.float32(1.0) - np.float32(p)))

    def forward(self, x):
        if not self.training:
            return x
        mask = torch.from_numpy(dropped(self.module, self.state["key"], x.numel(), self.p)).reshape(x.shape)
        return torch.where(mask, torch.zeros((), dtype=x.dtype), x * torch.tensor(self.keep_scale, dtype=x.dtype))


def make_untied_model():
    """The fixture Llama with tie_word_embeddings false and an lm_head of its own (deterministic)."""
    os.makedirs(UNTIED_DIR, exist_ok=True)
    with open(os.path.join(MODEL_DIR, "config.json")) as f:
        config = json.load(f)
    config["tie_word_embeddings"] = False
    with open(os.path.join(UNTIED_DIR, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    weights = load_file(os.path.join(MODEL_DIR, "model.safetensors"))
    g = torch.Generator().manual_seed(99)
    embed = weights["model.embed_tokens.weight"]
    weights["lm_head.weight"] = (torch.randn(embed.shape, generator=g) * 0.1).contiguous()
    save_file(weights, os.path.join(UNTIED_DIR, "model.safetensors"), metadata={"format": "pt"})


def batch(vocab):
    g = torch.Generator().manual_seed(1234)
    tokens = torch.randint(0, vocab, (B, T), generator=g)
    labels = torch.roll(tokens, -1, dims=1).clone()
    labels[:, -1] = -100
    labels[0, :3] = -100  # a masked prompt
    labels[1, 10:] = -100  # a padded tail
    return tokens, labels


def run(model_dir, targets, use_dora, dropout):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    config = LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=dropout, target_modules=targets, use_dora=use_dora)
    model = get_peft_model(model, config)
    state = {"key": 0}
    if dropout > 0:
        replaced = 0
        for name, module in model.named_modules():
            if hasattr(module, "lora_dropout") and "default" in module.lora_dropout:
                assert isinstance(module.lora_dropout["default"], torch.nn.Dropout), name
                ktune_name = name[len("base_model.model."):]
                module.lora_dropout["default"] = KtuneMaskDropout(ktune_name, dropout, state)
                replaced += 1
        assert replaced > 0
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    model.train()
    tokens, labels = batch(model.config.vocab_size)

    out = {"tokens": tokens, "labels": labels}
    for name, value in get_peft_model_state_dict(model, save_embedding_layers=False).items():
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
        state["key"] = step
        optimizer.zero_grad()
        logits = model(input_ids=tokens).logits  # (B, T, V)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                                 ignore_index=-100, reduction="mean")
        loss.backward()
        out[f"loss.{step}"] = loss.detach().clone()
        for n, p in live.items():
            out[f"grad.{step}.{saved_names[n]}"] = p.grad.detach().clone()
        optimizer.step()
    for name, value in get_peft_model_state_dict(model, save_embedding_layers=False).items():
        out["final." + name] = value.detach().clone()
    out["settings"] = torch.tensor([LR, BETAS[0], BETAS[1], EPS, WEIGHT_DECAY, ALPHA / RANK, dropout, SEED],
                                   dtype=torch.float32)
    out["targets"] = torch.tensor(list(",".join(targets).encode()), dtype=torch.uint8)
    return {k: v.contiguous() for k, v in out.items()}


if __name__ == "__main__":
    make_untied_model()
    print("wrote", UNTIED_DIR)
    head = TARGETS + ["lm_head"]
    for name, model_dir, targets, dora, dropout in (
            ("lora", MODEL_DIR, TARGETS, False, 0.0),
            ("dora", MODEL_DIR, TARGETS, True, 0.0),
            ("lora_dropout", MODEL_DIR, TARGETS, False, 0.25),
            ("dora_dropout", MODEL_DIR, TARGETS, True, 0.25),
            ("lora_head_dropout", UNTIED_DIR, head, False, 0.25),
            ("dora_head", UNTIED_DIR, head, True, 0.0),
            ("dora_head_dropout", UNTIED_DIR, head, True, 0.25)):
        path = os.path.join(HERE, name + ".safetensors")
        save_file(run(model_dir, targets, dora, dropout), path)
        print("wrote", path, os.path.getsize(path), "bytes")
