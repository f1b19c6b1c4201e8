// The torchtune recipe and config table: which recipe and config a TrainJob runs, given the node
// count, the processes per node and the PEFT args (upstream's getRecipeAndConfig, row for row), the
// model key derived from a runtime name, and the set of configs torchtune ships for each model
// (copied from torchtune 0.6.1's recipe registry; tests/runtime/fixtures proves the copy).
//
// It decides nothing about validity: validation.h turns a missing config into an error.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace ktune {

inline constexpr const char* kFullFinetuneSingleDevice = "full_finetune_single_device";
inline constexpr const char* kFullFinetuneDistributed = "full_finetune_distributed";
inline constexpr const char* kLoraFinetuneSingleDevice = "lora_finetune_single_device";
inline constexpr const char* kLoraFinetuneDistributed = "lora_finetune_distributed";

// Keys the runtime owns; a user arg setting one is refused.
inline const std::vector<std::string>& runtime_owned_keys() {
  static const std::vector<std::string> keys{"output_dir", "tokenizer.path", "checkpointer.checkpoint_dir",
                                             "tokenizer.merges_file"};
  return keys;
}

// "torchtune-llama3.2-1b" -> "llama3_2/1B"; "" unless the name has exactly three '-' fields.
std::string model_key_from_runtime_name(const std::string& runtime_name);

// What the user's args ask for (upstream's substring tests on the args, kept as they are):
bool args_enable_lora(const std::vector<std::string>& args);   // some arg contains model.lora_attn_modules
bool args_enable_qlora(const std::vector<std::string>& args);  // model.quantize_base and no model.use_dora

struct RecipeChoice {
  std::string recipe;   // "lora_finetune_single_device"
  std::string suffix;   // "_lora_single_device"
  std::string config;   // model_key + suffix: "llama3_2/1B_lora_single_device"
};

// The table of upstream-compat.md, first match wins. num_proc_per_node is the resolved count.
RecipeChoice select_recipe(const std::string& model_key, int num_nodes, int num_proc_per_node,
                           const std::vector<std::string>& args);

// torchtune's configs for a model key: {config name, recipe}. Empty for an unknown model.
struct TorchTuneConfigEntry {
  std::string config;   // "llama3_2/1B_lora_single_device"
  std::string recipe;   // "lora_finetune_single_device"
};
const std::vector<TorchTuneConfigEntry>& torchtune_configs(const std::string& model_key);
std::vector<std::string> supported_models();   // every model key with configs, in catalog order
bool torchtune_config_exists(const std::string& config);

}  // namespace ktune
