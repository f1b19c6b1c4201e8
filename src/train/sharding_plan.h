// The scaling model of sharded data parallelism, as a pure function: for a model config, a world
// of nnodes × nproc_per_node ranks, a recipe (full or LoRA), a dtype and a LoRA rank, how many
// bytes of parameters, gradients and AdamW state each rank holds, how much it gathers for the
// duration of a step, how many bytes it sends per optimizer step, and what a checkpoint takes on disk. It uses the same flat
// layout (FlatShardLayout: 16-float alignment, padding to 16·W) and the same units (one per
// decoder layer, one for embeddings + final norm + output projection) as ShardedDataParallel, so
// on this machine its figures are the ones a run prints (tested). `ktune plan` prints it.
//
// Conventions (say them with the numbers):
//  - One dtype for parameters, gradients and both AdamW moments (torchtune's `dtype`: bf16 = 2 bytes
//    each, 8 bytes per trainable parameter; fp32 = 16). ktune's CPU recipes keep f32 whatever dtype
//    says: plan them with fp32.
//  - Communication is what each rank sends with ring algorithms: all-gather and reduce-scatter of N
//    values send (W-1)/W·N each, all-reduce 2·(W-1)/W·N. FSDP: a forward all-gather of every unit,
//    a backward all-gather of every layer again when reshard_after_forward, a reduce-scatter of the
//    gradients — per micro-batch. Replicated (DDP): one all-reduce of the gradients per step.
//  - LoRA: the frozen base is sharded too (what ktune and torchtune's FSDP do), gathered with its
//    unit (forward, and backward for the input gradients) and never reduced; the figure for a
//    replicated base is given beside it. QLoRA's NF4 base is not modelled.
// It deliberately does not estimate activations (they depend on batch and sequence length; a run
// prints its activation arena), CUDA workspaces or allocator fragmentation.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace ktune::train {

struct ShardingPlanRequest {
  model::ModelConfig model;
  int nnodes = 1, nproc_per_node = 1;
  bool lora = false;
  int64_t lora_rank = 8;
  std::vector<std::string> lora_attn_modules = {"q_proj", "v_proj"};  // of q_proj, k_proj, v_proj, output_proj
  bool apply_lora_to_mlp = false;
  bool sharded = true;  // false: replicated weights, all-reduced gradients (DDP)
  bool reshard_after_forward = true;
  int64_t bytes_per_value = 4;  // fp32 4, bf16 2
  int gradient_accumulation_steps = 1;
};

struct ShardingPlan {
  int world_size = 1;
  int64_t total_params = 0, trainable_params = 0, frozen_params = 0;
  // Bytes per rank between steps.
  int64_t params = 0;           // trainable parameters this rank keeps (its shards, padding included)
  int64_t frozen = 0;                // frozen parameters (this rank's shards when sharded)
  int64_t frozen_if_replicated = 0;  // the same if every rank kept them whole
  int64_t gradients = 0;
  int64_t optimizer = 0;        // AdamW: two moments
  int64_t persistent() const { return params + frozen + gradients + optimizer; }
  // Bytes per rank gathered at most at once during a step (values and their gradients).
  int64_t gathered_peak = 0;
  // What a replicated run (DDP) holds per rank for the same model: params + grads + moments.
  int64_t replicated_persistent = 0;
  // Bytes each rank sends per optimizer step.
  int64_t all_gather_sent = 0, reduce_scatter_sent = 0, all_reduce_sent = 0;
  // Bytes of tensor data in each checkpoint rank 0 writes: the merged model (the base's tensors,
  // full or merged), LoRA's adapter file, and the recipe state (the trainable values and both
  // moments); in the plan's dtype, as a run writes them (files copied beside them not counted).
  int64_t checkpoint_model = 0, checkpoint_adapter = 0, checkpoint_recipe_state = 0;
  int64_t sent() const { return all_gather_sent + reduce_scatter_sent + all_reduce_sent; }
};

// Errors (ktune::Error) name the request field that is out of range.
ShardingPlan plan_sharding(const ShardingPlanRequest& request);

// The plan as `ktune plan` prints it: one quantity per line, GiB with bytes in parentheses.
std::string format_sharding_plan(const ShardingPlanRequest& request, const ShardingPlan& plan);

// The HF config of a known model by name (train/known_models.h: "llama3_3/70B",
// "meta-llama/Llama-3.3-70B-Instruct", "qwen2_5/7B", ...), or of a config.json / model directory path.
model::ModelConfig model_config_by_name_or_path(const std::string& name_or_path);

}  // namespace ktune::train
