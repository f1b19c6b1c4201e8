// The torchtune recipe and config table: which recipe and config a TrainJob runs, given the node
// count, the processes per node and the PEFT args (upstream's getRecipeAndConfig, row for row), the
// model key derived from a runtime name, and the config sets a trainer image may ship:
//   ConfigSet::torchtune()  torchtune 0.6.1's recipe registry (upstream's trainer image; copied here,
//                           tests/runtime/fixtures proves the copy). Upstream's validation rules
//                           (multi-node only for llama3_3/70B, QLoRA single-device only, ...) follow
//                           from it.
//   ConfigSet::bundled()    the configs ktune's trainer ships (configs/<family>/<name>.yaml, names
//                           embedded at build time): a superset, so ktune runs layouts upstream refuses.
//
// It decides nothing about validity: validation.h turns a config missing from the set into an error.
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

class ConfigSet {
 public:
  ConfigSet(std::vector<std::string> configs, std::string source);
  static const ConfigSet& torchtune();   // torchtune 0.6.1's registry, for the catalog's models
  static const ConfigSet& bundled();     // ktune's configs/ (empty if the tree had none at build time)
  bool contains(const std::string& config) const;
  std::vector<std::string> for_model(const std::string& model_key) const;  // "llama3_2/1B_full", ...
  const std::string& source() const { return source_; }   // for messages: "torchtune 0.6.1", ...
  bool empty() const { return configs_.empty(); }
  const std::vector<std::string>& configs() const { return configs_; }

 private:
  std::vector<std::string> configs_;     // sorted
  std::string source_;
};

// The table of upstream-compat.md, first match wins. num_proc_per_node is the resolved count.
// Where `configs` lacks <model>_full_single_device but has <model>_full_low_memory (torchtune's
// name for Mistral's), that one is chosen.
RecipeChoice select_recipe(const std::string& model_key, int num_nodes, int num_proc_per_node,
                           const std::vector<std::string>& args, const ConfigSet& configs = ConfigSet::torchtune());

// torchtune's configs for a model key: {config name, recipe}. Empty for an unknown model.
struct TorchTuneConfigEntry {
  std::string config;   // "llama3_2/1B_lora_single_device"
  std::string recipe;   // "lora_finetune_single_device"
};
const std::vector<TorchTuneConfigEntry>& torchtune_configs(const std::string& model_key);
std::vector<std::string> supported_models();   // the catalog's 13 model keys, in catalog order
bool torchtune_config_exists(const std::string& config);  // ConfigSet::torchtune().contains(config)

// The names embedded from configs/ at build time ("llama3_2/1B_lora", ...).
const std::vector<std::string>& bundled_config_names();

}  // namespace ktune
