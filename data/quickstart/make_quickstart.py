#!/usr/bin/env python3
"""Generates ktune's bundled quickstart instruction dataset (alpaca columns: instruction, input,
output) — small arithmetic and sorting tasks whose answers follow a rule, so a model fine-tuned
for a minute can be asked a held-out prompt and its answer checked exactly.

  train:      320 rows      validation: 40 rows (prompts never seen in train)
  jsonl/train.jsonl, jsonl/validation.jsonl
  data/train-00000-of-00001.parquet, data/validation-00000-of-00001.parquet  (HF file naming:
      `dataset.source=parquet dataset.data_dir=data/quickstart/data`, as upstream runtimes pass)

Deterministic (seeded); rerun to regenerate byte-identical files (needs pyarrow).
"""
import json
import os
import random

import pyarrow as pa
import pyarrow.parquet as pq

HERE = os.path.dirname(os.path.abspath(__file__))


def all_prompts():
    """Every (instruction, input, output) the generator can make, in a fixed order."""
    rows = []
    for a in range(0, 50):
        for b in range(0, 50):
            rows.append(("Add the two numbers.", f"{a} + {b}", str(a + b)))
    rng = random.Random(1)
    seen = set()
    while len(seen) < 400:
        t = tuple(rng.randrange(10) for _ in range(3))
        if t in seen:
            continue
        seen.add(t)
        rows.append(("Sort the numbers from smallest to largest.", ", ".join(map(str, t)),
                     ", ".join(map(str, sorted(t)))))
    for n in range(1, 100):
        rows.append((f"What number comes after {n}?", "", str(n + 1)))
    return rows


def main():
    rng = random.Random(0)
    rows = all_prompts()
    rng.shuffle(rows)
    # Roughly: 55% addition, 30% sorting, 15% successor, in both splits.
    def take(kind, n, pool):
        picked = [r for r in pool if r[0].startswith(kind)][:n]
        for r in picked:
            pool.remove(r)
        return picked
    pool = list(rows)
    train = take("Add", 176, pool) + take("Sort", 96, pool) + take("What", 48, pool)
    validation = take("Add", 22, pool) + take("Sort", 12, pool) + take("What", 6, pool)
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
