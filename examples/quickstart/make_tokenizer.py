"""Trains the quickstart model's tokenizer (tokenizer.json, committed beside this script).

A byte-level BPE in Llama 3's style — its special tokens (<|begin_of_text|>, <|start_header_id|>,
<|end_header_id|>, <|eot_id|>, ...), BOS added by the post-processor — over the quickstart dataset
in the alpaca prompt, with digits split one a token so that arithmetic and sorting stay learnable
by a tiny model. Deterministic: rerun to regenerate the same file.

    python3 examples/quickstart/make_tokenizer.py
"""
import json
import pathlib

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

HERE = pathlib.Path(__file__).resolve().parent
DATA = HERE.parent.parent / "data" / "quickstart" / "jsonl"

SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
           "<|finetune_right_pad_id|>"]

PROMPT_INPUT = ("Below is an instruction that describes a task, paired with an input that provides further context. "
                "Write a response that appropriately completes the request.\n\n"
                "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n")


def corpus():
    for name in ("train.jsonl", "validation.jsonl"):
        for line in (DATA / name).read_text().splitlines():
            row = json.loads(line)
            yield PROMPT_INPUT.format(**row) + row["output"]
    yield "user assistant system"


def main():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=384, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer=trainer)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
        special_tokens=[("<|begin_of_text|>", bos)])
    tok.save(str(HERE / "tokenizer.json"))
    print("vocab", tok.get_vocab_size(), "sample", tok.encode("### Input:\n4, 3, 1").tokens)


if __name__ == "__main__":
    main()
