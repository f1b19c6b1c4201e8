#!/usr/bin/env python3
"""transformers' count of the tokens an alpaca dataset becomes through a model's chat template.

Usage: chat_template_dataset_tokens.py MODEL_DIR PROMPTS DATA
  MODEL_DIR  tokenizer.json + tokenizer_config.json (with its chat_template), as AutoTokenizer loads them
  PROMPTS    the user turn of each row, a JSON string a line (`ktune generate --dry-run --template
             alpaca`, the very prompts alpaca_dataset trains on)
  DATA       the alpaca rows (JSON lines with "output"), in the same order
Prints {"samples": N, "tokens": T, "trained": K}: each conversation [user: prompt, assistant: output]
is apply_chat_template(tokenize=True) (+ the EOS where the ids do not already end with it); trained
counts the assistant's tokens (those after the ids of the user turn rendered alone), the labels a
recipe trains on (train_on_input False).
"""
import json
import sys

from transformers import AutoTokenizer


def main():
    tok = AutoTokenizer.from_pretrained(sys.argv[1])
    with open(sys.argv[2], encoding="utf-8") as f:
        prompts = [json.loads(line) for line in f if line.strip()]
    with open(sys.argv[3], encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    assert len(prompts) == len(rows), (len(prompts), len(rows))
    tokens = trained = 0
    for prompt, row in zip(prompts, rows):
        user = [{"role": "user", "content": prompt}]
        ids = list(tok.apply_chat_template(user + [{"role": "assistant", "content": row["output"]}], tokenize=True)["input_ids"])
        user_ids = list(tok.apply_chat_template(user, tokenize=True)["input_ids"])
        assert ids[: len(user_ids)] == user_ids
        trained += len(ids) - len(user_ids)
        tokens += len(ids) + (0 if ids[-1] == tok.eos_token_id else 1)  # the EOS appended (not trained on)
    print(json.dumps({"samples": len(rows), "tokens": tokens, "trained": trained}))


if __name__ == "__main__":
    main()
