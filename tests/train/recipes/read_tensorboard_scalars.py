#!/usr/bin/env python3
"""Prints the scalars of every TensorBoard event file under a folder, as TensorBoard itself reads
them (tensorboard's EventAccumulator, the loader behind `tensorboard --logdir`): one line each,
"<run folder> <tag> <step> <value>". Exit 3 when the tensorboard package is not installed.

Usage: read_tensorboard_scalars.py LOG_DIR
"""
import os
import sys

try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util
except ImportError as e:
    print(f"tensorboard is not installed: {e}")
    sys.exit(3)


def main(log_dir):
    for root, _, files in sorted(os.walk(log_dir)):
        if not any(f.startswith("events.out.tfevents.") for f in files):
            continue
        acc = EventAccumulator(root, size_guidance={"tensors": 0})
        acc.Reload()
        run = os.path.relpath(root, log_dir)
        for tag in sorted(acc.Tags()["tensors"]):
            for event in acc.Tensors(tag):
                print(run, tag, event.step, float(tensor_util.make_ndarray(event.tensor_proto)))


if __name__ == "__main__":
    main(sys.argv[1])
