#!/usr/bin/env python3
"""Compares ktune's bundled configs with torchtune 0.6.1's YAMLs of the same name, key by key, and
fails on any difference that configs/generate.py does not document.

Usage: configs/compare_with_torchtune.py [TORCHTUNE_CONFIGS_DIR]
The directory defaults to recipes/configs of an installed torchtune wheel (found without importing
torchtune, whose __init__ needs torchao): python3 -m venv /tmp/tt && /tmp/tt/bin/pip install
torchtune==0.6.1 --no-deps pyyaml && /tmp/tt/bin/python configs/compare_with_torchtune.py
"""
import importlib.util
import os
import sys

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))

# (key, why) differences that generate.py documents; a key ending in '*' matches a prefix.
DOCUMENTED = [
    ('optimizer._component_', 'full_single_device: bitsandbytes -> torch.optim.AdamW'),
    ('optimizer.fused', 'full_single_device: AdamW is fused like the distributed configs'),
    ('checkpointer.checkpoint_files', 'mistral: safetensors instead of pytorch_model-*.bin'),
    ('tensor_parallel_dim', '70B full: tensor parallelism left out'),
    ('tensor_parallel_plan*', '70B full: tensor parallelism left out'),
    ('output_dir', '70B_full_multinode: its own output_dir (torchtune reuses .../full)'),
]


def flat(d, prefix=''):
    out = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(flat(v, prefix + k + '.'))
    else:
        out[prefix[:-1]] = d
    return out


def documented(key, name):
    for k, _ in DOCUMENTED:
        if key == k or (k.endswith('*') and key.startswith(k[:-1])):
            if k.startswith('optimizer') and not name.endswith('full_single_device'):
                continue
            if k == 'checkpointer.checkpoint_files' and not name.startswith('mistral/'):
                continue
            if k == 'output_dir' and not name.endswith('full_multinode'):
                continue
            return True
    return False


def main():
    if len(sys.argv) > 1:
        tt = sys.argv[1]
    else:
        spec = importlib.util.find_spec('recipes')
        if spec is None:
            print('torchtune not installed; pass its recipes/configs directory')
            return 2
        tt = os.path.join(spec.submodule_search_locations[0], 'configs')
    compared, same, undocumented, documented_count = 0, 0, [], 0
    for root, _, names in os.walk(HERE):
        for n in sorted(names):
            if not n.endswith('.yaml'):
                continue
            rel = os.path.relpath(os.path.join(root, n), HERE)
            theirs = os.path.join(tt, rel)
            if not os.path.exists(theirs):
                continue
            compared += 1
            a = flat(yaml.safe_load(open(os.path.join(root, n))))
            b = flat(yaml.safe_load(open(theirs)))
            name = rel[:-5]
            diffs = []
            for key in sorted(set(a) | set(b)):
                if a.get(key, '<absent>') != b.get(key, '<absent>'):
                    diffs.append((key, a.get(key, '<absent>'), b.get(key, '<absent>')))
            if not diffs:
                same += 1
            for key, ours, theirs_v in diffs:
                if documented(key, name):
                    documented_count += 1
                else:
                    undocumented.append('%s: %s: ktune %r, torchtune %r' % (name, key, ours, theirs_v))
    print('compared %d configs with torchtune\'s: %d identical key by key, %d documented differences, '
          '%d undocumented' % (compared, same, documented_count, len(undocumented)))
    for line in undocumented:
        print('  ' + line)
    return 1 if undocumented or compared == 0 else 0


if __name__ == '__main__':
    sys.exit(main())
