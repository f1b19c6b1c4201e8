// `ktune plan --device cuda`: what a fine-tune on GPUs holds on each GPU, before anything is downloaded
// or started. The same mapping a run makes (plan_cuda_step, shard_cuda_step) and the same plan it
// allocates (cuda::Decoder::plan through the GPU step plugin, which touches no device, so it answers on
// a machine without a GPU): parameters, gradients, AdamW state and activations per GPU, with each
// attention path's total (a run's auto choice takes the fastest on its GPU), and whether that fits an
// H100's or an H200's memory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "train/sharding_plan.h"

namespace ktune::train {

// The model, world, recipe and LoRA placement as `ktune plan` takes them for either device (its
// bytes_per_value and gradient_accumulation_steps have no bearing here: the GPU step is bf16 and
// accumulates in place), and what only the GPU plan needs.
struct GpuMemoryPlanRequest {
  ShardingPlanRequest shared;  // sharded false: every GPU a replica; reshard_after_forward false: ZeRO-2
  bool apply_lora_to_output = false, quantize_base = false, use_dora = false;
  int64_t batch_size = 2, max_seq_len = 2048;
  bool activation_checkpointing = false, activation_offloading = false;
};

// The plan as `ktune plan --device cuda` prints it. Throws ktune::Error for a request the GPU step
// refuses (naming what it does not do), and where the plugin cannot be loaded (a build without CUDA).
std::string format_gpu_memory_plan(const GpuMemoryPlanRequest& request);

}  // namespace ktune::train
