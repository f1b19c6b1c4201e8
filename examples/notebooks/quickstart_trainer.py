#!/usr/bin/env python3
"""The trainer the notebooks' local backend runs for `tune run` when the model is the quickstart's
tiny Llama (examples/quickstart: 0.8M parameters, made by `ktune init-model`).

The catalog's torchtune runtimes name real models: `torchtune-llama3.2-1b` plans
`lora_finetune_single_device --config llama3_2/1B_lora_single_device`, whose model builder is
Llama 3.2 1B's fixed architecture and whose tokenizer is Llama 3's tokenizer.model. The tiny model
has neither, so this script runs ktune's own trainer (`ktune run`) with exactly the recipe, config
and overrides the control plane planned (everything the SDK call set: LoRA rank/alpha/modules,
batch size, epochs, dtype, the dataset component and files, output and checkpoint dirs), followed
by the overrides that fit that config to the tiny model on a CPU, as configs/tiny/lora_single_device.yaml
sets them: the model and tokenizer builders that read the checkpoint's config.json and
tokenizer.json, the CPU, no gradient accumulation, and a learning rate and warmup for a few dozen steps.

usage (BackendConfig.trainer_command = [python3, this file, KTUNE_EXE]):
    quickstart_trainer.py KTUNE_EXE [launcher flags] RECIPE --config CONFIG key=value ...

It changes nothing else and adds no training logic: the recipe, the data pipeline and the
checkpoints are ktune's.
"""
import os
import sys


def main(argv):
    if len(argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    ktune_exe, rest = argv[0], argv[1:]
    # Launcher flags (--nnodes, --rdzv_endpoint, ...) come before the recipe; a single-device
    # recipe has none, and `ktune run` takes them in the same places.
    overrides = dict(a.split("=", 1) for a in rest if "=" in a and not a.startswith("-"))
    checkpoint_dir = overrides.get("checkpointer.checkpoint_dir")
    if not checkpoint_dir:
        print("quickstart_trainer: the plan set no checkpointer.checkpoint_dir", file=sys.stderr)
        return 2
    tiny = [
        "model=ktune.models.lora_hf_model" if "model.lora_attn_modules" in overrides else "model=ktune.models.hf_model",
        "tokenizer=ktune.models.hf_tokenizer",
        f"tokenizer.path={checkpoint_dir}/tokenizer.json",
        "tokenizer.max_seq_len=256",
        "device=cpu",
        "gradient_accumulation_steps=1",
        "optimizer.fused=False",
        "optimizer.lr=3e-3",
        "lr_scheduler.num_warmup_steps=5",
    ]
    # A model this small trains fastest on one thread (its GEMMs are too small for a parallel region).
    os.environ.setdefault("KTUNE_NUM_THREADS", "1")
    cmd = [ktune_exe, "run", *rest, *tiny]
    print("quickstart_trainer: " + " ".join(cmd), flush=True)
    os.execv(ktune_exe, cmd)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
