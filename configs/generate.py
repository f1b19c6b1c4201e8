#!/usr/bin/env python3
"""Writes ktune's bundled recipe configs, configs/<family>/<size>_<variant>.yaml.

One table of per-model facts (MODELS: builders, tokenizer, files, checkpoint format) and one of
the training knobs torchtune 0.6.1 ships for each (model, variant) (TORCHTUNE_KNOBS, transcribed
from the YAMLs in its wheel, recipes/configs/). Every name the Kubeflow control plane's recipe
table can produce is written: _full, _full_single_device, _lora, _lora_single_device,
_qlora_single_device, _qlora, and _full_multinode for the 70B models. A variant torchtune does
not ship takes its knobs from the nearest one it does (DERIVED_FROM) and says so in its header.

Deliberate differences from torchtune, each also noted in the affected files:
  * full_single_device uses torch.optim.AdamW (torchtune: bitsandbytes PagedAdamW(8bit), CUDA-only).
  * Mistral reads model-0000k-of-00002.safetensors (torchtune: pytorch_model-*.bin), the files the
    upstream model initializer downloads.
  * tensor_parallel_* keys of the 70B _full configs are left out (ktune shards with FSDP only).
  * Qwen2.5 has no qlora_ builder in torchtune: its QLoRA configs use the lora_ builder with
    quantize_base: True, which is how the upstream SDK asks for QLoRA anyway.

Usage: configs/generate.py            rewrite the files
       configs/generate.py --check    exit 1 (listing them) if any file differs from the table
It needs only the Python standard library.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# family, size -> facts. builder: the torchtune builder suffix after the family module.
MODELS = {
    ('llama3_2', '1B'): dict(hf='Llama-3.2-1B-Instruct', builder='llama3_2_1b', tokenizer='llama3',
                             files=['model.safetensors'], model_type='LLAMA3_2'),
    ('llama3_2', '3B'): dict(hf='Llama-3.2-3B-Instruct', builder='llama3_2_3b', tokenizer='llama3',
                             files=['model-00001-of-00002.safetensors', 'model-00002-of-00002.safetensors'],
                             model_type='LLAMA3_2'),
    ('llama3_1', '8B'): dict(hf='Meta-Llama-3.1-8B-Instruct', builder='llama3_1_8b', tokenizer='llama3',
                             files=['model-0000%d-of-00004.safetensors' % i for i in range(1, 5)],
                             model_type='LLAMA3'),
    ('llama3_1', '70B'): dict(hf='Meta-Llama-3.1-70B-Instruct', builder='llama3_1_70b', tokenizer='llama3',
                              files=('model-{}-of-{}.safetensors', '00030'), model_type='LLAMA3'),
    ('llama3_3', '70B'): dict(hf='Llama-3.3-70B-Instruct', builder='llama3_3_70b', tokenizer='llama3',
                              files=('model-{}-of-{}.safetensors', '00030'), model_type='LLAMA3'),
    ('qwen2_5', '0.5B'): dict(hf='Qwen2.5-0.5B-Instruct', builder='qwen2_5_0_5b', tokenizer='qwen2_5',
                              files=['model.safetensors'], model_type='QWEN2', no_qlora_builder=True),
    ('qwen2_5', '1.5B'): dict(hf='Qwen2.5-1.5B-Instruct', builder='qwen2_5_1_5b_instruct', tokenizer='qwen2_5',
                              files=['model.safetensors'], model_type='QWEN2', no_qlora_builder=True),
    ('qwen2_5', '3B'): dict(hf='Qwen2.5-3B-Instruct', builder='qwen2_5_3b', tokenizer='qwen2_5',
                            files=['model-00001-of-00002.safetensors', 'model-00002-of-00002.safetensors'],
                            model_type='QWEN2', no_qlora_builder=True),
    ('qwen2_5', '7B'): dict(hf='Qwen2.5-7B-Instruct', builder='qwen2_5_7b_instruct', tokenizer='qwen2_5',
                            files=['model-0000%d-of-00004.safetensors' % i for i in range(1, 5)],
                            model_type='QWEN2', no_qlora_builder=True),
    ('gemma2', '2B'): dict(hf='gemma-2-2b', builder='gemma2_2b', tokenizer='gemma',
                           files=['model-0000%d-of-00003.safetensors' % i for i in range(1, 4)],
                           model_type='GEMMA2', no_output_lora=True),
    ('gemma2', '9B'): dict(hf='gemma-2-9b', builder='gemma2_9b', tokenizer='gemma',
                           files=('model-{}-of-{}.safetensors', '00008'), model_type='GEMMA2', no_output_lora=True),
    ('gemma2', '27B'): dict(hf='gemma-2-27b', builder='gemma2_27b', tokenizer='gemma',
                            files=('model-{}-of-{}.safetensors', '00024'), model_type='GEMMA2', no_output_lora=True),
    ('mistral', '7B'): dict(hf='Mistral-7B-v0.1', builder='mistral_7b', tokenizer='mistral',
                            files=['model-00001-of-00002.safetensors', 'model-00002-of-00002.safetensors'],
                            model_type='MISTRAL'),
}

TOKENIZERS = {
    'llama3': ('torchtune.models.llama3.llama3_tokenizer', 'original/tokenizer.model'),
    'qwen2_5': ('torchtune.models.qwen2_5.qwen2_5_tokenizer', 'vocab.json'),
    'gemma': ('torchtune.models.gemma.gemma_tokenizer', 'tokenizer.model'),
    'mistral': ('torchtune.models.mistral.mistral_tokenizer', 'tokenizer.model'),
}

VARIANTS = ['full', 'full_single_device', 'full_multinode', 'lora', 'lora_single_device', 'qlora',
            'qlora_single_device']
RECIPE = {'full': 'full_finetune_distributed', 'full_multinode': 'full_finetune_distributed',
          'full_single_device': 'full_finetune_single_device', 'lora': 'lora_finetune_distributed',
          'qlora': 'lora_finetune_distributed', 'lora_single_device': 'lora_finetune_single_device',
          'qlora_single_device': 'lora_finetune_single_device'}
# A variant torchtune does not ship takes the knobs of the first of these it does ship.
DERIVED_FROM = {
    'full': ['full_multinode'],
    'full_single_device': ['full'],
    'full_multinode': ['full'],
    'lora': ['lora_single_device'],
    'lora_single_device': ['lora'],
    'qlora': ['lora', 'qlora_single_device'],
    'qlora_single_device': ['qlora', 'lora_single_device', 'lora'],
}
MULTINODE = {('llama3_1', '70B'), ('llama3_3', '70B')}
# The _full_multinode knobs of llama3_3 70B, for llama3_1 70B whose torchtune has no such file.
MULTINODE_TEMPLATE = ('llama3_3', '70B')

# torchtune 0.6.1's values. Keys: batch_size, ga (gradient_accumulation_steps), lr, wd
# (weight_decay), fused, opt (optimizer class), in_bwd (optimizer_in_bwd), warmup
# (num_warmup_steps), rank, alpha, lora_out (apply_lora_to_output), adapter_only
# (save_adapter_weights_only), ac (activation checkpointing), ds (dataset builder), packed,
# max_seq_len ('absent' = key not written), peak (log_peak_memory_stats), compile, cpu_off
# (fsdp_cpu_offload), sharded (custom_sharded_layers), low_cpu_ram, prof_warmup (profiler.warmup_steps).
TORCHTUNE_KNOBS = {
    ('llama3_2', '1B'): {
        'full': {'batch_size': 4, 'ga': 8, 'lr': '2e-5', 'fused': True, 'opt': 'AdamW', 'in_bwd': False, 'ac': False, 'ds': 'alpaca_dataset', 'packed': False, 'max_seq_len': None, 'peak': True, 'compile': False},
        'full_single_device': {'batch_size': 4, 'ga': 1, 'lr': '2e-5', 'opt': 'PagedAdamW8bit', 'in_bwd': True, 'ac': False, 'ds': 'alpaca_dataset', 'packed': False, 'max_seq_len': None, 'peak': True, 'compile': False},
        'lora': {'batch_size': 4, 'ga': 8, 'lr': '3e-4', 'wd': 0.01, 'fused': True, 'opt': 'AdamW', 'warmup': 100, 'rank': 64, 'alpha': 128, 'adapter_only': False, 'ac': False, 'ds': 'alpaca_cleaned_dataset', 'packed': False, 'max_seq_len': None, 'peak': True, 'compile': False},
        'lora_single_device': {'batch_size': 4, 'ga': 8, 'lr': '3e-4', 'wd': 0.01, 'fused': True, 'opt': 'AdamW', 'warmup': 100, 'rank': 64, 'alpha': 128, 'adapter_only': False, 'ac': False, 'ds': 'alpaca_cleaned_dataset', 'packed': False, 'max_seq_len': None, 'peak': True, 'compile': False},
        'qlora_single_device': {'batch_size': 4, 'ga': 8, 'lr': '3e-4', 'wd': 0.01, 'fused': True, 'opt': 'AdamW', 'warmup': 100, 'rank': 64, 'alpha': 128, 'adapter_only': False, 'ac': False, 'ds': 'alpaca_cleaned_dataset', 'packed': False, 'max_seq_len': None, 'peak': True, 'compile': False},
    },
    ('llama3_2', '3B'): {
        'full': {'batch_size': 4, 'ga': 8, 'lr': '2e-5', 'fused': True, 'opt': 'AdamW', 'in_bwd': False, 'ac': True, 'ds': 'alpaca_dataset', 'packed': False, 'max_seq_len': None, 'peak': True, 'compile': False},
        'full_single_device': {'batch_size': 4, 'ga': 1, 'lr': '2e-5', 'opt': 'PagedAdamW8bit', 'in_bwd': True, 'ac': True, 'ds': 'alpaca_dataset', 'packed': False, 'max_seq_len': None, 'peak': True, 'compile': False},
        'lora': {'batch_size': 4, 'ga': 8, 'lr': '3e-4', 'wd': 0.01, 'fused': True, 'opt': 'AdamW', 'warmup': 100, 'rank': 64, 'alpha': 128, 'adapter_only': False, 'ac': False, 'ds': 'alpaca_cleaned_dataset', 'packed': False, 'max_seq_len': None, 'peak': True, 'compile': False},
        'lora_single_device': {'batch_size': 4, 'ga': 8, 'lr': '3e-4', 'wd': 0.01, 'fused': True, 'opt': 'AdamW', 'warmup': 100, 'rank': 64, 'alpha': 128, 'adapter_only': False, 'ac': True, 'ds': 'alpaca_cleaned_dataset', 'packed': False, 'max_seq_len': None, 'peak': True, 'compile': False},
        'qlora_single_device': {'batch_size': 4, 'ga': 8, 'lr': '3e-4', 'wd': 0.01, 'fused': True, 'opt': 'AdamW', 'warmup': 100, 'rank': 64, 'alpha': 128, 'adapter_only': False, 'ac': True, 'ds': 'alpaca_cleaned_dataset', 'packed': False, 'max_seq_len': None, 'peak': True, 'compile': False},
    },
    ('llama3_1', '8B'): {
        'full': {'batch_size': 2, 'ga': 1, 'lr': '2e-5', 'fused': True, 'opt': 'AdamW', 'in_bwd': False, 'ac': True, 'ds': 'alpaca_dataset', 'packed': False, 'max_seq_len': None, 'peak': True, 'compile': False, 'sharded': ['tok_embeddings', 'output']},
        'full_single_device': {'batch_size': 2, 'ga': 1, 'lr': '2e-5', 'opt': 'PagedAdamW8bit', 'in_bwd': True, 'ac': True, 'ds': 'alpaca_dataset', 'packed': False, 'max_seq_len': None, 'peak': True, 'compile': False},
        'lora': {'batch_size': 2, 'ga': 8, 'lr': '3e-4', 'wd': 0.01, 'fused': True, 'opt': 'AdamW', 'warmup': 100, 'rank': 8, 'alpha': 16, 'lora_out': False, 'adapter_only': False, 'ac': False, 'ds': 'alpaca_cleaned_dataset', 'packed': False, 'max_seq_len': None, 'peak': True, 'compile': False},
        'lora_single_device': {'batch_size': 2, 'ga': 8, 'lr': '3e-4', 'wd': 0.01, 'fused': True, 'opt': 'AdamW', 'warmup': 100, 'rank': 8, 'alpha': 16, 'lora_out': False, 'adapter_only': False, 'ac': True, 'ds': 'alpaca_cleaned_dataset', 'packed': False, 'max_seq_len': None, 'peak': True, 'compile': False},
        'qlora_single_device': {'batch_size': 2, 'ga': 8, 'lr': '3e-4', 'wd': 0.01, 'fused': True, 'opt': 'AdamW', 'warmup': 100, 'rank': 8, 'alpha': 16, 'lora_out': False, 'adapter_only': False, 'ac': True, 'ds': 'alpaca_cleaned_dataset', 'packed': False, 'max_seq_len': None, 'peak': True, 'compile': False, 'low_cpu_ram': False},
    },
    ('llama3_1', '70B'): {
        'full': {'batch_size': 2, 'ga': 1, 'lr': '2e-5', 'fused': False, 'opt': 'AdamW', 'in_bwd': False, 'ac': True, 'ds': 'alpaca_dataset', 'packed': False, 'max_seq_len': None, 'peak': True, 'compile': False, 'cpu_off': True, 'sharded': ['tok_embeddings', 'output']},
        'lora': {'batch_size': 2, 'ga': 1, 'lr': '3e-4', 'wd': 0.01, 'fused': True, 'opt': 'AdamW', 'warmup': 100, 'rank': 16, 'alpha': 32, 'lora_out': False, 'adapter_only': True, 'ac': True, 'ds': 'alpaca_dataset', 'packed': False, 'max_seq_len': None, 'peak': True, 'compile': False},
    },
    ('llama3_3', '70B'): {
        'full': {'batch_size': 2, 'ga': 1, 'lr': '2e-5', 'fused': False, 'opt': 'AdamW', 'in_bwd': False, 'ac': True, 'ds': 'alpaca_dataset', 'packed': False, 'max_seq_len': None, 'peak': True, 'compile': False, 'cpu_off': True, 'sharded': ['tok_embeddings', 'output']},
        'full_multinode': {'batch_size': 4, 'ga': 1, 'lr': '2e-5', 'fused': True, 'opt': 'AdamW', 'in_bwd': False, 'ac': True, 'ds': 'alpaca_dataset', 'packed': True, 'max_seq_len': 1024, 'peak': True, 'compile': True, 'cpu_off': False, 'sharded': ['tok_embeddings', 'output']},
        'lora': {'batch_size': 2, 'ga': 1, 'lr': '3e-4', 'wd': 0.01, 'fused': True, 'opt': 'AdamW', 'warmup': 100, 'rank': 16, 'alpha': 32, 'lora_out': False, 'adapter_only': True, 'ac': True, 'ds': 'alpaca_dataset', 'packed': False, 'max_seq_len': None, 'peak': True, 'compile': False},
        'qlora': {'batch_size': 2, 'ga': 1, 'lr': '3e-4', 'wd': 0.01, 'fused': True, 'opt': 'AdamW', 'warmup': 100, 'rank': 16, 'alpha': 32, 'lora_out': False, 'adapter_only': True, 'ac': True, 'ds': 'alpaca_dataset', 'packed': False, 'max_seq_len': None, 'peak': True, 'compile': False},
    },
    ('qwen2_5', '0.5B'): {
        'full': {'batch_size': 2, 'ga': 8, 'lr': '2e-5', 'fused': True, 'opt': 'AdamW', 'in_bwd': False, 'ac': False, 'ds': 'alpaca_cleaned_dataset', 'packed': False, 'max_seq_len': None, 'peak': True, 'compile': False},
        'full_single_device': {'batch_size': 2, 'ga': 8, 'lr': '2e-5', 'fused': True, 'opt': 'AdamW', 'in_bwd': False, 'ac': False, 'ds': 'alpaca_cleaned_dataset', 'packed': False, 'max_seq_len': None, 'peak': True, 'compile': False},
        'lora': {'batch_size': 2, 'ga': 8, 'lr': '2e-3', 'wd': 0.01, 'fused': True, 'opt': 'AdamW', 'warmup': 100, 'rank': 32, 'alpha': 64, 'ac': False, 'ds': 'alpaca_cleaned_dataset', 'packed': False, 'max_seq_len': None, 'peak': True, 'compile': False},
        'lora_single_device': {'batch_size': 2, 'ga': 8, 'lr': '2e-3', 'wd': 0.01, 'fused': True, 'opt': 'AdamW', 'warmup': 100, 'rank': 32, 'alpha': 64, 'ac': False, 'ds': 'alpaca_cleaned_dataset', 'packed': False, 'max_seq_len': None, 'peak': True, 'compile': False},
    },
    ('qwen2_5', '1.5B'): {
        'full': {'batch_size': 2, 'ga': 1, 'lr': '2e-5', 'fused': True, 'opt': 'AdamW', 'in_bwd': False, 'ac': True, 'ds': 'alpaca_cleaned_dataset', 'packed': False, 'max_seq_len': None, 'peak': True, 'compile': False},
        'full_single_device': {'batch_size': 4, 'ga': 1, 'lr': '2e-5', 'opt': 'PagedAdamW', 'in_bwd': True, 'ac': True, 'ds': 'alpaca_cleaned_dataset', 'packed': False, 'max_seq_len': None, 'peak': True, 'compile': False},
        'lora': {'batch_size': 2, 'ga': 8, 'lr': '2e-5', 'fused': True, 'opt': 'AdamW', 'warmup': 100, 'rank': 32, 'alpha': 64, 'ac': False, 'ds': 'alpaca_cleaned_dataset', 'packed': False, 'max_seq_len': None, 'peak': True, 'compile': False},
        'lora_single_device': {'batch_size': 2, 'ga': 8, 'lr': '2e-3', 'fused': True, 'opt': 'AdamW', 'warmup': 100, 'rank': 32, 'alpha': 64, 'ac': False, 'ds': 'alpaca_cleaned_dataset', 'packed': False, 'max_seq_len': None, 'peak': True, 'compile': False},
    },
    ('qwen2_5', '3B'): {
        'full': {'batch_size': 2, 'ga': 8, 'lr': '5e-6', 'fused': True, 'opt': 'AdamW', 'in_bwd': False, 'ac': True, 'ds': 'alpaca_cleaned_dataset', 'packed': False, 'max_seq_len': None, 'peak': False, 'compile': False},
        'full_single_device': {'batch_size': 2, 'ga': 1, 'lr': '5e-6', 'opt': 'PagedAdamW', 'in_bwd': True, 'ac': True, 'ds': 'alpaca_cleaned_dataset', 'packed': False, 'max_seq_len': None, 'peak': False, 'compile': False},
        'lora': {'batch_size': 2, 'ga': 8, 'lr': '3e-4', 'wd': 0.01, 'fused': True, 'opt': 'AdamW', 'warmup': 100, 'rank': 8, 'alpha': 16, 'ac': False, 'ds': 'alpaca_cleaned_dataset', 'packed': False, 'max_seq_len': None, 'peak': False, 'compile': False, 'prof_warmup': 5},
        'lora_single_device': {'batch_size': 2, 'ga': 8, 'lr': '3e-4', 'wd': 0.01, 'fused': True, 'opt': 'AdamW', 'warmup': 100, 'rank': 8, 'alpha': 16, 'ac': True, 'ds': 'alpaca_cleaned_dataset', 'packed': False, 'max_seq_len': None, 'peak': False, 'compile': False, 'prof_warmup': 5},
    },
    ('qwen2_5', '7B'): {
        'full': {'batch_size': 2, 'ga': 8, 'lr': '5e-6', 'fused': True, 'opt': 'AdamW', 'in_bwd': False, 'ac': True, 'ds': 'alpaca_cleaned_dataset', 'packed': False, 'max_seq_len': None, 'peak': False, 'compile': False},
        'full_single_device': {'batch_size': 2, 'ga': 1, 'lr': '5e-6', 'opt': 'PagedAdamW', 'in_bwd': True, 'ac': True, 'ds': 'alpaca_cleaned_dataset', 'packed': False, 'max_seq_len': None, 'peak': False, 'compile': False},
        'lora': {'batch_size': 2, 'ga': 8, 'lr': '3e-4', 'wd': 0.01, 'fused': True, 'opt': 'AdamW', 'warmup': 100, 'rank': 8, 'alpha': 16, 'lora_out': False, 'ac': False, 'ds': 'alpaca_cleaned_dataset', 'packed': False, 'max_seq_len': None, 'peak': False, 'compile': False, 'prof_warmup': 5},
        'lora_single_device': {'batch_size': 2, 'ga': 8, 'lr': '3e-4', 'wd': 0.01, 'fused': True, 'opt': 'AdamW', 'warmup': 100, 'rank': 8, 'alpha': 16, 'lora_out': False, 'ac': True, 'ds': 'alpaca_cleaned_dataset', 'packed': False, 'max_seq_len': None, 'peak': False, 'compile': False, 'prof_warmup': 5},
    },
    ('gemma2', '2B'): {
        'full': {'batch_size': 2, 'ga': 1, 'lr': '2e-5', 'fused': True, 'opt': 'AdamW', 'in_bwd': False, 'ac': True, 'ds': 'alpaca_dataset', 'packed': False, 'max_seq_len': 'absent', 'peak': True, 'compile': False},
        'lora': {'batch_size': 4, 'ga': 1, 'lr': '2e-5', 'fused': True, 'opt': 'AdamW', 'warmup': 10, 'rank': 64, 'alpha': 128, 'adapter_only': False, 'ac': True, 'ds': 'alpaca_dataset', 'packed': False, 'max_seq_len': 'absent', 'peak': True, 'compile': False},
        'lora_single_device': {'batch_size': 8, 'ga': 8, 'lr': '2e-5', 'fused': True, 'opt': 'AdamW', 'warmup': 10, 'rank': 64, 'alpha': 128, 'adapter_only': False, 'ac': True, 'ds': 'alpaca_dataset', 'packed': False, 'max_seq_len': 'absent', 'peak': True, 'compile': False, 'prof_warmup': 5},
        'qlora_single_device': {'batch_size': 4, 'ga': 8, 'lr': '2e-5', 'fused': True, 'opt': 'AdamW', 'warmup': 10, 'rank': 64, 'alpha': 128, 'adapter_only': False, 'ac': True, 'ds': 'alpaca_dataset', 'packed': False, 'max_seq_len': 'absent', 'peak': True, 'compile': False, 'prof_warmup': 5},
    },
    ('gemma2', '9B'): {
        'full': {'batch_size': 1, 'ga': 1, 'lr': '2e-5', 'fused': True, 'opt': 'AdamW', 'in_bwd': False, 'ac': True, 'ds': 'alpaca_dataset', 'packed': False, 'max_seq_len': 'absent', 'peak': True, 'compile': False},
        'lora': {'batch_size': 4, 'ga': 1, 'lr': '2e-5', 'fused': True, 'opt': 'AdamW', 'warmup': 10, 'rank': 64, 'alpha': 128, 'adapter_only': False, 'ac': True, 'ds': 'alpaca_dataset', 'packed': False, 'max_seq_len': 'absent', 'peak': True, 'compile': False},
        'lora_single_device': {'batch_size': 8, 'ga': 8, 'lr': '5e-5', 'fused': True, 'opt': 'AdamW', 'warmup': 10, 'rank': 8, 'alpha': 16, 'adapter_only': False, 'ac': True, 'ds': 'alpaca_dataset', 'packed': False, 'max_seq_len': 'absent', 'peak': True, 'compile': False, 'prof_warmup': 5},
        'qlora_single_device': {'batch_size': 4, 'ga': 8, 'lr': '2e-5', 'fused': True, 'opt': 'AdamW', 'warmup': 10, 'rank': 64, 'alpha': 128, 'adapter_only': False, 'ac': True, 'ds': 'alpaca_dataset', 'packed': False, 'max_seq_len': 'absent', 'peak': True, 'compile': False, 'low_cpu_ram': False, 'prof_warmup': 5},
    },
    ('gemma2', '27B'): {
        'full': {'batch_size': 1, 'ga': 1, 'lr': '2e-5', 'fused': True, 'opt': 'AdamW', 'in_bwd': False, 'ac': True, 'ds': 'alpaca_dataset', 'packed': False, 'max_seq_len': 'absent', 'peak': True, 'compile': False},
        'lora': {'batch_size': 4, 'ga': 1, 'lr': '2e-5', 'fused': True, 'opt': 'AdamW', 'warmup': 10, 'rank': 64, 'alpha': 128, 'adapter_only': False, 'ac': True, 'ds': 'alpaca_dataset', 'packed': False, 'max_seq_len': 'absent', 'peak': True, 'compile': False},
        'lora_single_device': {'batch_size': 2, 'ga': 8, 'lr': '5e-5', 'fused': True, 'opt': 'AdamW', 'warmup': 10, 'rank': 8, 'alpha': 16, 'adapter_only': False, 'ac': True, 'ds': 'alpaca_dataset', 'packed': False, 'max_seq_len': 'absent', 'peak': True, 'compile': False, 'prof_warmup': 5},
        'qlora_single_device': {'batch_size': 4, 'ga': 8, 'lr': '2e-5', 'fused': True, 'opt': 'AdamW', 'warmup': 10, 'rank': 64, 'alpha': 128, 'adapter_only': False, 'ac': True, 'ds': 'alpaca_dataset', 'packed': False, 'max_seq_len': 'absent', 'peak': True, 'compile': False, 'low_cpu_ram': False, 'prof_warmup': 5},
    },
    ('mistral', '7B'): {
        'full': {'batch_size': 2, 'ga': 1, 'lr': '5e-6', 'fused': True, 'opt': 'AdamW', 'in_bwd': False, 'ac': True, 'ds': 'alpaca_dataset', 'packed': False, 'max_seq_len': None, 'peak': True, 'compile': False},
        'lora': {'batch_size': 4, 'ga': 1, 'lr': '2e-5', 'fused': True, 'opt': 'AdamW', 'warmup': 100, 'rank': 64, 'alpha': 16, 'lora_out': True, 'adapter_only': False, 'ac': True, 'ds': 'alpaca_dataset', 'packed': False, 'max_seq_len': None, 'peak': True, 'compile': False},
        'lora_single_device': {'batch_size': 4, 'ga': 8, 'lr': '2e-5', 'fused': True, 'opt': 'AdamW', 'warmup': 100, 'rank': 64, 'alpha': 16, 'lora_out': True, 'adapter_only': False, 'ac': True, 'ds': 'alpaca_dataset', 'packed': False, 'max_seq_len': None, 'peak': True, 'compile': False, 'prof_warmup': 5},
        'qlora_single_device': {'batch_size': 4, 'ga': 8, 'lr': '2e-5', 'fused': True, 'opt': 'AdamW', 'warmup': 100, 'rank': 64, 'alpha': 16, 'lora_out': False, 'adapter_only': False, 'ac': True, 'ds': 'alpaca_dataset', 'packed': False, 'max_seq_len': None, 'peak': True, 'compile': False, 'low_cpu_ram': False, 'prof_warmup': 5},
    },
}

DISTRIBUTED_ONLY = ('cpu_off', 'sharded')
SINGLE_DEVICE_ONLY = ('low_cpu_ram',)


def knobs_for(model, variant):
    shipped = TORCHTUNE_KNOBS[model]
    if variant in shipped:
        return dict(shipped[variant]), None
    if variant == 'full_multinode' and model != MULTINODE_TEMPLATE:
        return dict(TORCHTUNE_KNOBS[MULTINODE_TEMPLATE]['full_multinode']), \
            '%s/%s_full_multinode' % MULTINODE_TEMPLATE
    for source in DERIVED_FROM[variant]:
        if source in shipped:
            k = dict(shipped[source])
            if RECIPE[variant].endswith('single_device'):
                for key in DISTRIBUTED_ONLY:
                    k.pop(key, None)
            else:
                for key in SINGLE_DEVICE_ONLY:
                    k.pop(key, None)
            if variant == 'full_single_device':
                k['in_bwd'] = False
            return k, '%s/%s_%s' % (model[0], model[1], source)
    raise SystemExit('no torchtune config to derive %s %s from' % (model, variant))


def yaml_value(v):
    if v is None:
        return 'null'
    if v is True:
        return 'True'
    if v is False:
        return 'False'
    if isinstance(v, list):
        return '[' + ', '.join(yaml_value(x) for x in v) + ']'
    return str(v)


def render(model, variant):
    family, size = model
    facts = MODELS[model]
    k, derived = knobs_for(model, variant)
    recipe = RECIPE[variant]
    lora = variant in ('lora', 'lora_single_device', 'qlora', 'qlora_single_device')
    qlora = variant.startswith('qlora')
    distributed = not recipe.endswith('single_device')
    name = '%s/%s_%s' % (family, size, variant)
    hf_dir = '/tmp/%s' % facts['hf']
    notes = []

    out = []
    w = out.append
    w('# Config for %s: %s %s, %s.' % (recipe, family, size,
                                      {'full': 'full fine-tuning', 'full_single_device': 'full fine-tuning',
                                       'full_multinode': 'full fine-tuning across nodes', 'lora': 'LoRA',
                                       'lora_single_device': 'LoRA', 'qlora': 'QLoRA (NF4 base weights)',
                                       'qlora_single_device': 'QLoRA (NF4 base weights)'}[variant]))
    w('# Generated by configs/generate.py; do not edit (change the table there and rerun it).')
    if derived:
        w('# torchtune 0.6.1 ships no %s; the training values are those of its %s.' % (name, derived))
    else:
        w('# Values as torchtune 0.6.1\'s recipes/configs/%s.yaml.' % name)
    if variant == 'full_single_device' and k.get('opt', 'AdamW') != 'AdamW':
        w('# torchtune uses bitsandbytes.optim.%s here (CUDA-only); ktune uses torch.optim.AdamW.' % k['opt'])
    if family == 'mistral':
        w('# torchtune reads pytorch_model-*.bin; ktune reads the safetensors files of the same HF repo.')
    w('#')
    w('# Get the model (Hugging Face):')
    w('#   ktune download %s --output-dir %s' % (hf_repo(model), hf_dir))
    w('# Run:')
    launcher = '--nnodes 2 --nproc_per_node 8 --rdzv_endpoint HOST:29500 ' if variant == 'full_multinode' else (
        '--nproc_per_node 2 ' if distributed else '')
    w('#   ktune run %s%s --config %s' % (launcher, recipe, name))
    w('# Override any key on the command line, e.g. checkpointer.checkpoint_dir=<DIR> batch_size=8.')
    w('')
    w('output_dir: /tmp/torchtune/%s_%s/%s' % (family, size.replace('.', '_'), variant))
    w('')
    w('# Model')
    w('model:')
    if lora:
        builder = facts['builder']
        prefix = 'qlora_' if qlora and not facts.get('no_qlora_builder') else 'lora_'
        w('  _component_: torchtune.models.%s.%s%s' % (family, prefix, builder))
        w("  lora_attn_modules: ['q_proj', 'v_proj', 'output_proj']")
        w('  apply_lora_to_mlp: True')
        if 'lora_out' in k and not facts.get('no_output_lora'):
            w('  apply_lora_to_output: %s' % yaml_value(k['lora_out']))
        w('  lora_rank: %d  # higher increases accuracy and memory' % k['rank'])
        w('  lora_alpha: %d  # usually alpha=2*rank' % k['alpha'])
        w('  lora_dropout: 0.0')
        if qlora and facts.get('no_qlora_builder'):
            w('  quantize_base: True  # NF4 base weights (torchtune has no qlora_ builder for %s)' % family)
    else:
        w('  _component_: torchtune.models.%s.%s' % (family, facts['builder']))
    w('')
    w('# Tokenizer')
    tok_component, tok_file = TOKENIZERS[facts['tokenizer']]
    w('tokenizer:')
    w('  _component_: %s' % tok_component)
    w('  path: %s/%s' % (hf_dir, tok_file))
    if facts['tokenizer'] == 'qwen2_5':
        w('  merges_file: %s/merges.txt' % hf_dir)
    if k.get('max_seq_len', 'absent') != 'absent':
        w('  max_seq_len: %s' % yaml_value(k['max_seq_len']))
    w('')
    w('# Checkpointer: reads and writes Hugging Face safetensors')
    w('checkpointer:')
    w('  _component_: torchtune.training.FullModelHFCheckpointer')
    w('  checkpoint_dir: %s%s' % (hf_dir, '' if family in ('qwen2_5', 'mistral') else '/'))
    files = facts['files']
    if isinstance(files, tuple):
        w('  checkpoint_files:')
        w('    filename_format: %s' % files[0])
        w('    max_filename: "%s"' % files[1])
    else:
        w('  checkpoint_files: [')
        for f in files:
            w('    %s,' % f)
        w('  ]')
    w('  recipe_checkpoint: null')
    w('  output_dir: ${output_dir}')
    w('  model_type: %s' % facts['model_type'])
    w('resume_from_checkpoint: False')
    if lora and 'adapter_only' in k:
        w('save_adapter_weights_only: %s' % yaml_value(k['adapter_only']))
    w('')
    w('# Dataset and sampler')
    w('dataset:')
    w('  _component_: torchtune.datasets.%s' % k['ds'])
    w('  packed: %s  # True increases speed' % yaml_value(k['packed']))
    w('seed: null')
    w('shuffle: True')
    w('batch_size: %d' % k['batch_size'])
    w('')
    w('# Optimizer and scheduler')
    w('optimizer:')
    w('  _component_: torch.optim.AdamW')
    if 'fused' in k:
        w('  fused: %s' % yaml_value(k['fused']))
    if 'wd' in k:
        w('  weight_decay: %s' % k['wd'])
    w('  lr: %s' % k['lr'])
    if 'warmup' in k:
        w('lr_scheduler:')
        w('  _component_: torchtune.training.lr_schedulers.get_cosine_schedule_with_warmup')
        w('  num_warmup_steps: %d' % k['warmup'])
    if not lora:
        w('optimizer_in_bwd: %s  # True saves memory; needs gradient_accumulation_steps=1' %
          yaml_value(k.get('in_bwd', False)))
    w('loss:')
    w('  _component_: torchtune.modules.loss.CEWithChunkedOutputLoss')
    w('')
    w('# Training')
    w('epochs: 1')
    w('max_steps_per_epoch: null')
    w('gradient_accumulation_steps: %d  # Use to increase effective batch size' % k['ga'])
    w('clip_grad_norm: null')
    w('compile: %s  # accepted for torchtune compatibility; ktune compiles ahead of time' % yaml_value(k['compile']))
    if distributed:
        if 'sharded' in k:
            w('custom_sharded_layers: %s' % yaml_value(k['sharded']))
        if 'cpu_off' in k:
            w('fsdp_cpu_offload: %s' % yaml_value(k['cpu_off']))
    if not distributed and 'low_cpu_ram' in k:
        w('low_cpu_ram: %s' % yaml_value(k['low_cpu_ram']))
    w('')
    w('# Logging')
    w('metric_logger:')
    w('  _component_: torchtune.training.metric_logging.DiskLogger')
    w('  log_dir: ${output_dir}/logs')
    w('log_every_n_steps: 1')
    w('log_peak_memory_stats: %s' % yaml_value(k['peak']))
    w('')
    w('# Environment')
    w('device: cuda')
    w('dtype: bf16')
    w('')
    w('# Activations memory')
    w('enable_activation_checkpointing: %s  # True reduces memory' % yaml_value(k['ac']))
    w('enable_activation_offloading: False  # True reduces memory')
    w('')
    w('# Profiler (disabled; accepted for torchtune compatibility)')
    w('profiler:')
    w('  _component_: torchtune.training.setup_torch_profiler')
    w('  enabled: False')
    w('  output_dir: ${output_dir}/profiling_outputs')
    w('  cpu: True')
    w('  cuda: True')
    w('  profile_memory: False')
    w('  with_stack: False')
    w('  record_shapes: True')
    w('  with_flops: False')
    w('  wait_steps: 5')
    w('  warmup_steps: %d' % k.get('prof_warmup', 3))
    w('  active_steps: 2')
    w('  num_cycles: 1')
    return '\n'.join(out) + '\n'


def hf_repo(model):
    org = {'llama3_2': 'meta-llama', 'llama3_1': 'meta-llama', 'llama3_3': 'meta-llama', 'qwen2_5': 'Qwen',
           'gemma2': 'google', 'mistral': 'mistralai'}[model[0]]
    return '%s/%s' % (org, MODELS[model]['hf'])


# The quickstart's tiny model: its HF directory (config.json, model.safetensors, tokenizer.json)
# and a small instruction dataset are created by the quickstart; the model's architecture is read
# from config.json (ktune.models.*hf_model), so no torchtune builder is needed.
TINY_DIR = '/tmp/ktune-tiny'


def render_tiny(variant):
    lora = variant == 'lora_single_device'
    recipe = RECIPE[variant]
    lines = [
        '# Config for %s on the quickstart\'s tiny model (%s), on the CPU.' % (recipe, 'LoRA' if lora else 'full'),
        '# Generated by configs/generate.py; do not edit.',
        '# The quickstart creates %s (an HF model directory with tokenizer.json) and its dataset.' % TINY_DIR,
        '#   ktune run %s --config tiny/%s' % (recipe, variant),
        '',
        'output_dir: %s/output/%s' % (TINY_DIR, variant),
        '',
        'model:',
        '  _component_: ktune.models.%shf_model' % ('lora_' if lora else ''),
    ]
    if lora:
        lines += ["  lora_attn_modules: ['q_proj', 'k_proj', 'v_proj', 'output_proj']",
                  '  apply_lora_to_mlp: True',
                  '  apply_lora_to_output: False',
                  '  lora_rank: 8',
                  '  lora_alpha: 16',
                  '  lora_dropout: 0.0']
    lines += [
        '',
        'tokenizer:',
        '  _component_: ktune.models.hf_tokenizer',
        '  path: %s/model/tokenizer.json' % TINY_DIR,
        '  max_seq_len: 256',
        '',
        'checkpointer:',
        '  _component_: torchtune.training.FullModelHFCheckpointer',
        '  checkpoint_dir: %s/model' % TINY_DIR,
        '  checkpoint_files: [model.safetensors]',
        '  recipe_checkpoint: null',
        '  output_dir: ${output_dir}',
        '  model_type: LLAMA3',
        'resume_from_checkpoint: False',
    ]
    if lora:
        lines.append('save_adapter_weights_only: False')
    lines += [
        '',
        'dataset:',
        '  _component_: torchtune.datasets.instruct_dataset',
        '  source: json',
        '  data_files: %s/data/train.jsonl' % TINY_DIR,
        '  split: train',
        '  train_on_input: False',
        '  packed: False',
        'seed: 1234',
        'shuffle: True',
        'batch_size: 8',
        '',
        'optimizer:',
        '  _component_: torch.optim.AdamW',
        '  weight_decay: 0.0',
        '  lr: %s' % ('3e-3' if lora else '1e-3'),
        'lr_scheduler:',
        '  _component_: torchtune.training.lr_schedulers.get_cosine_schedule_with_warmup',
        '  num_warmup_steps: 5',
    ]
    if not lora:
        lines.append('optimizer_in_bwd: False')
    lines += [
        'loss:',
        '  _component_: torchtune.modules.loss.CEWithChunkedOutputLoss',
        '',
        'epochs: 3',
        'max_steps_per_epoch: null',
        'gradient_accumulation_steps: 1',
        'clip_grad_norm: 1.0',
        'compile: False',
        '',
        'metric_logger:',
        '  _component_: torchtune.training.metric_logging.DiskLogger',
        '  log_dir: ${output_dir}/logs',
        'log_every_n_steps: 1',
        'log_peak_memory_stats: True',
        '',
        'device: cpu',
        'dtype: fp32',
        'enable_activation_checkpointing: False',
        'enable_activation_offloading: False',
    ]
    return '\n'.join(lines) + '\n'


def all_files():
    files = {}
    for model in MODELS:
        for variant in VARIANTS:
            if variant == 'full_multinode' and model not in MULTINODE:
                continue
            files['%s/%s_%s.yaml' % (model[0], model[1], variant)] = render(model, variant)
    for variant in ('lora_single_device', 'full_single_device'):
        files['tiny/%s.yaml' % variant] = render_tiny(variant)
    return files


def main():
    check = '--check' in sys.argv[1:]
    files = all_files()
    differ = []
    for rel, text in sorted(files.items()):
        path = os.path.join(HERE, rel)
        current = open(path).read() if os.path.exists(path) else None
        if current == text:
            continue
        if check:
            differ.append(rel)
        else:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, 'w') as f:
                f.write(text)
    # Files in configs/ that the table no longer produces are stale.
    for root, _, names in os.walk(HERE):
        for n in names:
            rel = os.path.relpath(os.path.join(root, n), HERE)
            if n.endswith('.yaml') and rel not in files:
                differ.append(rel + ' (not produced by the table)')
    if check and differ:
        print('configs differ from configs/generate.py:\n  ' + '\n  '.join(differ))
        return 1
    if not check:
        print('wrote %d configs' % len(files))
    return 0


if __name__ == '__main__':
    sys.exit(main())
