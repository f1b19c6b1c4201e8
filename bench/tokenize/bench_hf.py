#!/usr/bin/env python3
"""HF `tokenizers` side of bench/tokenize: MB/s of Tokenizer.encode (one document at a time, on one
thread; also by that thread's CPU clock) and Tokenizer.encode_batch (all documents, RAYON_NUM_THREADS threads), best of --repeat,
after one warm-up pass. Writes {"single_mb_s", "batch_mb_s", "ids"} to --json (ids: for ktune to
check it produced exactly the same tokens). add_special_tokens=False on both sides."""
import argparse
import json
import time

from tokenizers import Tokenizer

p = argparse.ArgumentParser()
p.add_argument("--tokenizer", required=True)
p.add_argument("--docs", required=True)
p.add_argument("--repeat", type=int, default=3)
p.add_argument("--json", required=True)
a = p.parse_args()
tok = Tokenizer.from_file(a.tokenizer)
docs = [json.loads(line) for line in open(a.docs, encoding="utf-8")]
mb = sum(len(d.encode("utf-8")) for d in docs) / 1e6


def best(fn):
    """Best wall-clock and best thread-CPU seconds over --repeat timed runs after a warm-up run.
    The CPU clock is robust to other processes sharing the cores."""
    result = fn()
    wall, cpu = [], []
    for _ in range(a.repeat):
        t, c = time.perf_counter(), time.thread_time()
        result = fn()
        wall.append(time.perf_counter() - t)
        cpu.append(time.thread_time() - c)
    return min(wall), min(cpu), result


single, single_cpu, _ = best(lambda: [tok.encode(d, add_special_tokens=False) for d in docs])
batch, _, encodings = best(lambda: tok.encode_batch(docs, add_special_tokens=False))
ids = [e.ids for e in encodings]
json.dump({"single_mb_s": mb / single, "single_cpu_mb_s": mb / single_cpu, "batch_mb_s": mb / batch, "ids": ids},
          open(a.json, "w"))
