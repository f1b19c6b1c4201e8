#!/usr/bin/env python3
"""`ktune generate` against HF transformers' generate() on the same work, in one run.

Two comparisons: one prompt, and the same prompt --batch times answered together (ktune's
--batch-size, HF's batched input_ids). A random-weight Llama-shaped model (`ktune init-model`, with the quickstart's tokenizer grown to the
real vocabulary's size by added words, so that every id the model chooses decodes), one prompt of about
--prompt-tokens tokens, greedy decoding of --new-tokens tokens (or, with --temperature, sampling
with --top-p / --top-k on both sides: the tokens differ, each side drawing from its own random
stream, but the work is the same), f32, the same thread count. Both
use a KV cache (the prompt once, then a token a step). Timed: the generation only (ktune's own log
line; HF's generate() call after a warm-up), not the model's load.

Prints each side's prompt and step rates, the ratios, whether the two chose the same tokens, and
the ceiling a decoding step has on this machine: every step reads all the weights, so steps/s
cannot beat read bandwidth / weight bytes (the bandwidth measured here with torch.sum). HF's
prompt time is a generate() of one token; its steps are the rest of the full call.
"""
import argparse
import json
import os
import re
import subprocess
import tempfile
import time

SHAPES = {
    # hidden, intermediate, layers, heads, kv heads, head dim, vocab
    "small": (1024, 4096, 8, 16, 8, 64, 128256),
    "1b": (2048, 8192, 16, 32, 8, 64, 128256),  # Llama-3.2-1B
}
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QUICKSTART = os.path.join(REPO, "examples", "quickstart")


def make_model(ktune, shape, directory):
    C, I, L, H, KV, D, V = SHAPES[shape]
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": V, "hidden_size": C,
        "intermediate_size": I, "num_hidden_layers": L, "num_attention_heads": H, "num_key_value_heads": KV,
        "head_dim": D, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
        "rope_scaling": None, "tie_word_embeddings": True, "attention_bias": False, "mlp_bias": False,
        "hidden_act": "silu", "bos_token_id": 0, "eos_token_id": 4, "torch_dtype": "float32",
    }
    path = os.path.join(directory, "config.json")
    with open(path, "w") as f:
        json.dump(config, f)
    model = os.path.join(directory, "model")
    subprocess.run([ktune, "init-model", "--config", path, "--output-dir", model, "--seed", "0",
                    "--copy", os.path.join(QUICKSTART, "tokenizer_config.json")], check=True, capture_output=True)
    write_tokenizer(os.path.join(model, "tokenizer.json"), V)
    return model, config


def write_tokenizer(path, vocab_size):
    """The quickstart's tokenizer with words "<wN>" added for the ids past its own, up to the model's
    vocabulary: a random model chooses any id, and each must decode."""
    with open(os.path.join(QUICKSTART, "tokenizer.json")) as f:
        tokenizer = json.load(f)
    first = len(tokenizer["model"]["vocab"])
    assert all(t["id"] < first for t in tokenizer["added_tokens"])
    tokenizer["added_tokens"] += [{"id": i, "content": f"<w{i}>", "single_word": False, "lstrip": False,
                                   "rstrip": False, "normalized": False, "special": False}
                                  for i in range(first, vocab_size)]
    with open(path, "w") as f:
        json.dump(tokenizer, f)


def prompt_of(tokens):
    # Rows of the quickstart's kind, enough of them for about `tokens` tokens.
    line = "Sort the numbers from smallest to largest. 4, 3, 1 and reverse 7, 2, 9, 5. "
    return (line * (tokens // 30 + 1)).strip()


def sampling_flags(sampling):
    t, k, p = sampling
    return [] if t == 0 else ["--temperature", str(t), "--top-k", str(k), "--top-p", str(p), "--seed", "1"]


def run_ktune(ktune, model, prompt, new_tokens, threads, batch, directory, sampling):
    """The same prompt `batch` times, answered together (--batch-size batch)."""
    prompts = os.path.join(directory, "prompts.jsonl")
    with open(prompts, "w") as f:
        f.write((json.dumps(prompt) + "\n") * batch)
    env = dict(os.environ, KTUNE_NUM_THREADS=str(threads))
    r = subprocess.run([ktune, "generate", "--model", model, "--prompts", prompts, "--max-new-tokens", str(new_tokens),
                        "--batch-size", str(batch)] + sampling_flags(sampling), env=env, capture_output=True, text=True, check=True)
    m = re.search(r"generate: (\d+) prompt\(s\), (\d+) tokens in ([0-9.]+) s .*answers (\d+) tokens, the first of each "
                  r"with its prompt, then (\d+) step\(s\) of (\d+) tokens in ([0-9.]+) s", r.stderr)
    assert m and int(m.group(1)) == batch, r.stderr
    answers = [json.loads(line) for line in r.stdout.splitlines()]
    return {"prompt": int(m.group(2)), "prompt_s": float(m.group(3)), "new": int(m.group(4)), "steps": int(m.group(6)),
            "steps_s": float(m.group(7)), "text": answers[0]}


def run_hf(model, prompt, new_tokens, threads, bos, eos, batch, sampling):
    """generate() of the same prompt in `batch` rows (no padding needed)."""
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    tokenizer = Tokenizer.from_file(os.path.join(model, "tokenizer.json"))
    ids = [bos] + tokenizer.encode(prompt, add_special_tokens=False).ids
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    input_ids = torch.tensor([ids] * batch)

    t, k, p = sampling
    choice = dict(do_sample=False) if t == 0 else dict(do_sample=True, temperature=t, top_k=k or None, top_p=p)
    torch.manual_seed(1)

    def timed(n):
        start = time.perf_counter()
        out = hf.generate(input_ids, max_new_tokens=n, eos_token_id=eos, pad_token_id=eos, **choice)
        return out, time.perf_counter() - start

    with torch.inference_mode():
        timed(2)  # warm-up
        _, prompt_s = timed(1)  # the prompts' pass and the first tokens
        out, total_s = timed(new_tokens)
    new = out[0, len(ids):].tolist()
    if eos in new:
        new = new[:new.index(eos)]  # ktune does not count the stop token
    return {"prompt": len(ids) * batch, "prompt_s": prompt_s, "new": len(new) * batch,
            "steps": max(len(new) - 1, 0) * batch, "steps_s": total_s - prompt_s, "total_s": total_s,
            "text": tokenizer.decode(new, skip_special_tokens=True)}


def read_bandwidth_gbs(threads):
    """Bytes a second torch.sum reads from a 512 MiB f32 tensor on `threads` threads (best of 5)."""
    import torch
    torch.set_num_threads(threads)
    a = torch.ones(128 << 20, dtype=torch.float32)
    best = 0.0
    for _ in range(5):
        start = time.perf_counter()
        a.sum()
        best = max(best, a.numel() * 4 / (time.perf_counter() - start))
    return best / 1e9


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ktune", required=True)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--shape", choices=sorted(SHAPES), default="small")
    p.add_argument("--prompt-tokens", type=int, default=200)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--batch", type=int, default=8, help="prompts answered together in the second comparison")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy; > 0: sample")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    a = p.parse_args()
    sampling = (a.temperature, a.top_k, a.top_p)
    with tempfile.TemporaryDirectory() as tmp:
        model, config = make_model(a.ktune, a.shape, tmp)
        prompt = prompt_of(a.prompt_tokens)
        results = {}
        for batch in (1, a.batch):
            k = min((run_ktune(a.ktune, model, prompt, a.new_tokens, a.threads, batch, tmp, sampling) for _ in range(2)),
                    key=lambda r: r["prompt_s"] + r["steps_s"])
            h = run_hf(model, prompt, a.new_tokens, a.threads, config["bos_token_id"], config["eos_token_id"], batch, sampling)
            results[batch] = (k, h)
        weight_bytes = sum(os.path.getsize(os.path.join(model, f)) for f in os.listdir(model) if f.endswith(".safetensors"))
    gbs = read_bandwidth_gbs(a.threads)

    def rates(r):
        return (f"prompts {r['prompt']} tokens in {r['prompt_s']:.2f} s ({r['prompt'] / r['prompt_s']:.0f} tokens/s), "
                f"then {r['steps']} tokens in {r['steps_s']:.2f} s ({r['steps'] / r['steps_s']:.1f} tokens/s); "
                f"{r['new']} new tokens in {r['prompt_s'] + r['steps_s']:.2f} s")

    how = "greedy" if a.temperature == 0 else f"sampled (temperature {a.temperature}, top_k {a.top_k}, top_p {a.top_p})"
    print(f"model: {a.shape} Llama shape, {weight_bytes / 2**30:.2f} GiB f32 weights; {a.threads} threads; {how}")
    for batch, (k, h) in results.items():
        print(f"-- {batch} prompt(s) answered together")
        print(f"ktune generate:        {rates(k)}")
        print(f"transformers generate: {rates(h)}")
        if a.temperature == 0:
            print(f"same answer: {'yes' if k['text'] == h['text'] else 'no (random weights: near-ties may break differently)'}")
        speed = (k["new"] / (k["prompt_s"] + k["steps_s"])) / (h["new"] / (h["prompt_s"] + h["steps_s"]))
        print(f"generate ratio (batch {batch}): ktune/transformers speed {speed:.2f}x "
              f"(prompts {(k['prompt'] / k['prompt_s']) / (h['prompt'] / h['prompt_s']):.2f}x, "
              f"steps {(k['steps'] / k['steps_s']) / (h['steps'] / h['steps_s']):.2f}x)")
    k = results[1][0]
    print(f"ceiling of one answer's steps: each reads every weight: {gbs:.1f} GB/s read bandwidth (torch.sum, "
          f"{a.threads} threads) / {weight_bytes / 1e9:.2f} GB = {gbs * 1e9 / weight_bytes:.1f} steps/s; "
          f"ktune's at {k['steps'] / k['steps_s'] / (gbs * 1e9 / weight_bytes):.0%} of it")


if __name__ == "__main__":
    main()
