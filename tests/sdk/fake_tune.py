#!/usr/bin/env python3
"""A TEST STAND-IN for the trainer and the initializers, used by the sdk end-to-end tests until
ktune's own trainer (`ktune run`) exists. It trains nothing.

  fake_tune.py run [--nnodes N --nproc_per_node P --rdzv_endpoint H:P] RECIPE --config CFG k=v ...
      behaves like `tune run` from the outside: parses the launcher flags, the recipe, the config
      and the key=value overrides; reads the dataset the overrides point at (dataset.data_dir or
      dataset.data_files) and the checkpoint dir; computes total_steps = epochs * ceil(rows /
      batch_size); per step prints a torchtune-style line and appends a progress line (the
      KTUNE_PROGRESS_FILE contract, see src/sdk/progress.h); then writes
      <output_dir>/epoch_<E>/adapter_model.safetensors (placeholder bytes), adapter_config.json and
      <output_dir>/fake_tune_run.json (everything it was given, so tests can check it).
      Exits 2 on a missing required override, 3 on an unreadable dataset or model.

  fake_tune.py initializer dataset|model
      writes a tiny dataset (KTUNE_FAKE_ROWS json rows, default 6, into
      <KTUNE_WORKSPACE>/dataset/<path after the repo in STORAGE_URI>/train.json) or a tiny model
      folder (config.json, original/tokenizer.model) into <KTUNE_WORKSPACE>/model, and checks that
      ACCESS_TOKEN reached it when KTUNE_FAKE_EXPECT_TOKEN_REVERSED (the token backwards) is set (without printing it).
"""
import json
import math
import os
import sys
import time


def progress(path, record):
    if not path:
        return
    line = json.dumps(record) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode())  # one write per line: the contract
    finally:
        os.close(fd)


def run(argv):
    launcher = {}
    i = 0
    while i < len(argv) and argv[i].startswith("--"):
        flag = argv[i]
        if "=" in flag:
            k, v = flag[2:].split("=", 1)
        else:
            k, v = flag[2:], argv[i + 1]
            i += 1
        launcher[k] = v
        i += 1
    recipe = argv[i]
    i += 1
    if argv[i] != "--config":
        print("fake_tune: expected --config after the recipe", file=sys.stderr)
        return 2
    config = argv[i + 1]
    overrides = {}
    for kv in argv[i + 2:]:
        k, v = kv.split("=", 1)
        overrides[k] = v
    for required in ("output_dir", "checkpointer.checkpoint_dir"):
        if required not in overrides:
            print(f"fake_tune: missing override {required}", file=sys.stderr)
            return 2
    data = overrides.get("dataset.data_dir") or overrides.get("dataset.data_files")
    rows = 0
    try:
        files = [data] if os.path.isfile(data) else [os.path.join(data, f) for f in sorted(os.listdir(data))]
        for f in files:
            with open(f) as fh:
                rows += len(json.load(fh))
        if not os.listdir(overrides["checkpointer.checkpoint_dir"]):
            raise OSError("empty checkpoint dir")
    except (OSError, TypeError, ValueError) as e:
        print(f"fake_tune: cannot read the dataset or model: {e}", file=sys.stderr)
        return 3
    epochs = int(overrides.get("epochs", 1))
    batch = int(overrides.get("batch_size", 1))
    per_epoch = math.ceil(rows / batch)
    total = epochs * per_epoch
    delay = float(os.environ.get("KTUNE_FAKE_STEP_SECONDS", "0.05"))
    print(f"INFO: Running {recipe} with config {config} (fake trainer: nothing is trained)", flush=True)
    step = 0
    loss = 2.5
    for epoch in range(epochs):
        for b in range(per_epoch):
            time.sleep(delay)
            step += 1
            loss *= 0.9
            print(f"{epoch + 1}|{step}|Loss: {loss:.4f}", flush=True)
            progress(os.environ.get("KTUNE_PROGRESS_FILE"),
                     {"step": step, "total_steps": total, "epoch": epoch, "loss": loss, "lr": 3e-4,
                      "tokens_per_second": 1000.0, "time": time.time()})
        out = os.path.join(overrides["output_dir"], f"epoch_{epoch}")
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "adapter_model.safetensors"), "wb") as fh:
            fh.write(b"fake adapter, epoch %d\n" % epoch)
        with open(os.path.join(out, "adapter_config.json"), "w") as fh:
            json.dump({"peft_type": "LORA", "fake": True}, fh)
    with open(os.path.join(overrides["output_dir"], "fake_tune_run.json"), "w") as fh:
        json.dump({"launcher": launcher, "recipe": recipe, "config": config, "overrides": overrides,
                   "rows": rows, "total_steps": total, "cwd": os.getcwd(),
                   "env": {k: v for k, v in os.environ.items()
                           if k.startswith(("PET_", "MASTER_", "KTUNE_PROGRESS"))}}, fh, indent=1)
    print("INFO: training finished", flush=True)
    return 0


def initializer(kind):
    ws = os.environ.get("KTUNE_WORKSPACE", "/workspace")
    uri = os.environ.get("STORAGE_URI", "")
    expected = os.environ.get("KTUNE_FAKE_EXPECT_TOKEN_REVERSED")
    if expected is not None and os.environ.get("ACCESS_TOKEN") != expected[::-1]:
        print(f"fake_tune: {kind} initializer did not get the access token", file=sys.stderr)
        return 4
    print(f"{kind}-initializer: fetching {uri} (fake: writing a tiny {kind})", flush=True)
    if kind == "dataset":
        parts = uri.removeprefix("hf://").split("/")
        target = os.path.join(ws, "dataset", *parts[2:])
        os.makedirs(target, exist_ok=True)
        n = int(os.environ.get("KTUNE_FAKE_ROWS", "6"))
        rows = [{"instruction": f"say {i}", "input": "", "output": str(i)} for i in range(n)]
        with open(os.path.join(target, "train.json"), "w") as fh:
            json.dump(rows, fh)
    else:
        target = os.path.join(ws, "model")
        os.makedirs(os.path.join(target, "original"), exist_ok=True)
        with open(os.path.join(target, "config.json"), "w") as fh:
            json.dump({"model_type": "llama", "fake": True}, fh)
        with open(os.path.join(target, "original", "tokenizer.model"), "wb") as fh:
            fh.write(b"fake tokenizer\n")
    return 0


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "run":
        return run(sys.argv[2:])
    if len(sys.argv) == 3 and sys.argv[1] == "initializer":
        return initializer(sys.argv[2])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
