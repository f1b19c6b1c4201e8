"""Loads a ktune checkpoint the way users will — the merged model with transformers'
AutoModelForCausalLM, the adapter with peft's PeftModel.from_pretrained over the base model — and
writes their logits for the given token ids, for the C++ test to compare with ktune's own.

    python3 hf_peft_logits.py BASE_DIR CHECKPOINT_DIR OUT.safetensors ID ID ID ...

Writes "merged" (1, T, V) and, when CHECKPOINT_DIR holds adapter_config.json, "peft" (1, T, V).
Exit code 3 when torch/transformers/peft are missing (the test then skips, saying so).
"""
import os
import sys
import tempfile

try:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM
except ImportError as e:  # pragma: no cover
    print(f"missing reference package: {e}", file=sys.stderr)
    sys.exit(3)


def main():
    base_dir, ckpt_dir, out = sys.argv[1:4]
    ids = torch.tensor([[int(t) for t in sys.argv[4:]]])
    torch.manual_seed(0)
    results = {}
    # transformers >= 5 with peft installed treats a directory holding config.json *and*
    # adapter_config.json as a model with an embedded adapter, and applies the adapter on top of the
    # (already merged) weights. torchtune's layout puts both in epoch_N/, so the merged model is read
    # from a view of the directory without the adapter files.
    view = tempfile.mkdtemp(prefix="ktune_merged_")
    for name in os.listdir(ckpt_dir):
        if not name.startswith("adapter_"):
            os.symlink(os.path.join(os.path.abspath(ckpt_dir), name), os.path.join(view, name))
    merged = AutoModelForCausalLM.from_pretrained(view, dtype=torch.float32, attn_implementation="eager")
    merged.eval()
    with torch.no_grad():
        results["merged"] = merged(ids).logits.float().contiguous()
    if os.path.exists(os.path.join(ckpt_dir, "adapter_config.json")):
        try:
            from peft import PeftModel
        except ImportError as e:  # pragma: no cover
            print(f"missing reference package: {e}", file=sys.stderr)
            sys.exit(3)
        base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32, attn_implementation="eager")
        peft_model = PeftModel.from_pretrained(base, ckpt_dir)
        peft_model.eval()
        with torch.no_grad():
            results["peft"] = peft_model(ids).logits.float().contiguous()
    save_file(results, out)


if __name__ == "__main__":
    main()
