// The four torchtune recipes, natively: full_finetune_single_device, full_finetune_distributed,
// lora_finetune_single_device and lora_finetune_distributed. They share one loop (setup(), then
// train(), as torchtune's recipes read); what differs is policy chosen in setup from the
// RecipeSpec: LoRA/DoRA/QLoRA adapters or all weights trainable, one process or a process group.
// The distributed recipes shard the trainable parameters, their gradients and AdamW state across
// ranks (FSDP / ZeRO-3, train/sharded_data_parallel.h; fsdp_reshard_after_forward honoured; the
// frozen LoRA base is sharded too). env KTUNE_DATA_PARALLEL=replicate runs them with replicated
// weights and all-reduced gradients instead (DDP: the benchmark's baseline).
// device=cuda runs the steps on a GPU where this build has the CUDA backend and a GPU is visible
// (train/cuda_trainer.h; sharded over NCCL when distributed: ZeRO-3, or ZeRO-2 with
// fsdp_reshard_after_forward=False), and on the CPU otherwise, saying so; its host model keeps no
// gradients, and once the GPU holds the values only rank 0 keeps those its saves read.
// Every rank loads the checkpoint itself; the ranks compare fingerprints of their weights before
// training (train/weights_fingerprint.h) rather than receive rank 0's.
#pragma once

#include <chrono>

#include "dist/process_group.h"
#include "train/recipe_config.h"

namespace ktune::train {

// What a worker's GPU work needs beyond the group: its rendezvous store (to join an NCCL group over
// the GPUs), LOCAL_RANK (which GPU is its own) and the collectives' timeout (dist::WorkerEnv's, for
// the NCCL group as for the Gloo one). The defaults suit a single process.
struct WorkerDevices {
  dist::TcpStore* store = nullptr;
  int local_rank = 0;
  std::chrono::milliseconds collective_timeout = std::chrono::minutes(30);
};

// Runs the recipe to the end (or throws ktune::Error naming what is wrong). group: the world
// (a SingleProcessGroup for single-device recipes). Returns the process exit code.
int run_finetune(const RecipeConfig& config, const RecipeSpec& recipe, dist::ProcessGroup& group,
                 const WorkerDevices& devices = {});

}  // namespace ktune::train
