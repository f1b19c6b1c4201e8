#!/usr/bin/env python3
"""Generates ktune's bundled quickstart instruction dataset (alpaca columns: instruction, input,
output): two tasks whose answers follow a rule a ~1M-parameter model learns from a few hundred
rows in about a minute of training, so that after the quickstart's fine-tune a held-out prompt
can be asked and its answer checked exactly:

  "Sort the numbers from smallest to largest."  three digits      4, 3, 1     -> 1, 3, 4
  "Reverse the list."                           four digits       7, 0, 2, 2  -> 2, 2, 0, 7

  train:      320 rows (160 of each)      validation: 40 rows (20 of each; inputs never in train)
  jsonl/train.jsonl, jsonl/validation.jsonl
  data/train-00000-of-00001.parquet, data/validation-00000-of-00001.parquet  (HF file naming:
      `dataset.source=parquet dataset.data_dir=data/quickstart/data`, as upstream runtimes pass)

(Earlier versions held two-digit addition and "what number comes after n": the quickstart's model
memorised those rows without learning the rules, 1-3 of 40 held-out answers right.)

Deterministic (seeded); rerun to regenerate byte-identical files (needs pyarrow).
"""
import itertools
import json
import os
import random

import pyarrow as pa
import pyarrow.parquet as pq

HERE = os.path.dirname(os.path.abspath(__file__))
SORT = "Sort the numbers from smallest to largest."
REVERSE = "Reverse the list."
TRAIN_PER_TASK, VALIDATION_PER_TASK = 160, 20


def listed(digits):
    return ", ".join(map(str, digits))


def task_rows(rng):
    """Every row of each task, shuffled: (instruction, input, output)."""
    sort = [(SORT, listed(t), listed(sorted(t))) for t in itertools.product(range(10), repeat=3)]
    reverse = [(REVERSE, listed(t), listed(t[::-1])) for t in itertools.product(range(10), repeat=4)]
    rng.shuffle(sort)
    rng.shuffle(reverse)
    return sort, reverse


def main():
    rng = random.Random(0)
    sort, reverse = task_rows(rng)
    validation = sort[:VALIDATION_PER_TASK] + reverse[:VALIDATION_PER_TASK]
    train = (sort[VALIDATION_PER_TASK:VALIDATION_PER_TASK + TRAIN_PER_TASK] +
             reverse[VALIDATION_PER_TASK:VALIDATION_PER_TASK + TRAIN_PER_TASK])
    rng.shuffle(train)
    rng.shuffle(validation)
    assert not {r[:2] for r in train} & {r[:2] for r in validation}
    for split, data in (("train", train), ("validation", validation)):
        records = [{"instruction": i, "input": x, "output": y} for i, x, y in data]
        os.makedirs(os.path.join(HERE, "jsonl"), exist_ok=True)
        os.makedirs(os.path.join(HERE, "data"), exist_ok=True)
        with open(os.path.join(HERE, "jsonl", f"{split}.jsonl"), "w") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
        pq.write_table(pa.Table.from_pylist(records),
                       os.path.join(HERE, "data", f"{split}-00000-of-00001.parquet"))
        print(split, len(records))


if __name__ == "__main__":
    main()
