// The four torchtune recipes, natively: full_finetune_single_device, full_finetune_distributed,
// lora_finetune_single_device and lora_finetune_distributed. They share one loop (setup(), then
// train(), as torchtune's recipes read); what differs is policy chosen in setup from the
// RecipeSpec: LoRA/DoRA/QLoRA adapters or all weights trainable, one process or a process group.
// Data parallelism here replicates the model and sums gradients across ranks (DDP semantics);
// sharding parameters, gradients and optimizer state across ranks (FSDP) is not built yet.
#pragma once

#include "dist/process_group.h"
#include "train/recipe_config.h"

namespace ktune::train {

// Runs the recipe to the end (or throws ktune::Error naming what is wrong). group: the world
// (a SingleProcessGroup for single-device recipes). Returns the process exit code.
int run_finetune(const RecipeConfig& config, const RecipeSpec& recipe, dist::ProcessGroup& group);

}  // namespace ktune::train
