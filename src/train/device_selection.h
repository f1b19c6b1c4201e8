// Which engine runs a recipe's steps, and what the GPU one would be asked to do.
//   choose_step_device: `device: cpu` runs on the CPU engine (model/decoder.h). `device: cuda` (the
//     torchtune default) runs on the GPU step (model/cuda/decoder.h) when this build has the CUDA
//     backend and a GPU is present; otherwise on the CPU, saying why, so that torchtune's configs
//     run unchanged on a machine without a GPU.
//   plan_cuda_step: the GPU step's model and training setup mapped from the checkpoint's config.json
//     and the recipe's config, with every setting the GPU step does not do yet listed as a gap. A
//     run on the GPU with gaps is refused before anything trains (never silently different math).
// Pure functions of their arguments: no GPU is touched, so all of this is tested on the CPU.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/cuda/decoder.h"
#include "train/recipe_config.h"

namespace ktune::train {

enum class StepDevice { kCpu, kCuda };

struct DeviceChoice {
  StepDevice device = StepDevice::kCpu;
  std::string reason;  // one line for the log
};

// device: the config's value ("cpu" or "cuda"); cuda_built: this binary has the CUDA backend;
// gpu_count: usable GPUs (cuda::device_count(), 0 without a driver).
DeviceChoice choose_step_device(const std::string& device, bool cuda_built, int gpu_count);

struct CudaStepPlan {
  cuda::DecoderConfig model;
  cuda::TrainingSetup setup;
  // The tokens of a typical document in the step's rows (the training samples' mean length when
  // batches are packed or padding-free: rows of several samples), 0 for rows of one sample each: the
  // attention kernels' trials (KTUNE_CUDA_ATTENTION=auto) run on rows of such documents.
  int64_t attention_document_tokens = 0;
  std::vector<std::string> gaps;  // "<config key or model feature>: <what the GPU step lacks>"
};

// batch, seq_len: the shape the GPU step plans its memory for (each batch runs at its own length up
// to it; packed batches bring their positions and document ids).
CudaStepPlan plan_cuda_step(const RecipeConfig& cfg, const RecipeSpec& recipe, const model::ModelConfig& mc,
                            int64_t batch, int64_t seq_len);

// A distributed run's sharding of the GPU step, rank `rank` of `world` GPUs (a sharded recipe: FSDP's
// layout): the AdamW state over the GPUs; a full fine-tune's gradients too (ZeRO-2); and, with
// shard_layer_weights, the layers' weights (ZeRO-3: a full fine-tune's, or LoRA's frozen base), each
// gathered a layer ahead with prefetch. One GPU, or replicas: nothing.
void shard_cuda_step(CudaStepPlan& plan, int world, int rank, bool shard_layer_weights, bool prefetch);

// "device=cuda: the GPU step does not do …; set device=cpu to train on the CPU" for a refused plan.
std::string describe_gaps(const std::vector<std::string>& gaps);

}  // namespace ktune::train
