#!/usr/bin/env python3
"""Writes the benchmark's documents (JSON lines, one string each, ~2 KB per document): English prose
(the design documents beside the repository), source code (Python's standard library) and the
tokenizer fixtures' multilingual sample (emoji, CJK, combining marks, whitespace runs), mixed in a
fixed order. Deterministic. Usage: make_corpus.py OUT.jsonl [MEGABYTES]"""
import glob
import json
import os
import random
import sys
import sysconfig

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(os.path.dirname(here))
out, megabytes = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 2.0
target = int(megabytes * 1e6)

sources = []
for path in sorted(glob.glob(os.path.join(root, "..", "shared", "design", "*"))):
    if path.endswith((".md", ".txt")):
        sources.append(open(path, encoding="utf-8", errors="replace").read())
stdlib = sysconfig.get_paths()["stdlib"]
for path in sorted(glob.glob(os.path.join(stdlib, "*.py")))[:120]:
    sources.append(open(path, encoding="utf-8", errors="replace").read())
ref = json.load(open(os.path.join(root, "tests", "text", "fixtures", "reference.json"), encoding="utf-8"))
multilingual = [t for t in ref["texts"] if t]

rng = random.Random(42)
docs, size = [], 0
chunks = []
for s in sources:
    for i in range(0, len(s), 2000):
        chunks.append(s[i:i + 2000])
rng.shuffle(chunks)
i = 0
while size < target and chunks:
    doc = chunks[i % len(chunks)]
    if i % 4 == 0:  # one document in four mixes in the multilingual sample
        doc = " ".join(rng.choice(multilingual) for _ in range(12)) + "\n" + doc
    docs.append(doc)
    size += len(doc.encode("utf-8"))
    i += 1
with open(out, "w", encoding="utf-8") as f:
    for d in docs:
        f.write(json.dumps(d, ensure_ascii=False) + "\n")
print(f"{len(docs)} documents, {size / 1e6:.2f} MB", file=sys.stderr)
