// The four recipes ktune runs and the configs bundled with it (configs/<family>/<name>.yaml,
// compiled into the binary so that a lone `ktune` finds them, as torchtune finds its YAMLs in
// its wheel). A config belongs to a recipe by its name's suffix, as in torchtune:
//   _full_single_device → full_finetune_single_device     _full, _full_multinode → full_finetune_distributed
//   _lora_single_device, _qlora_single_device → lora_finetune_single_device
//   _lora, _qlora → lora_finetune_distributed
// It does not run recipes (the recipes themselves do) and does not check configs (config_schema.h).
#pragma once

#include <string>
#include <vector>

namespace ktune::train {

struct RecipeSpec {
  std::string name;  // "lora_finetune_single_device"
  bool lora = false;
  bool distributed = false;
  std::vector<std::string> configs;  // bundled config names, in `ktune ls` order
};

const std::vector<RecipeSpec>& all_recipes();
const RecipeSpec* find_recipe(const std::string& name);
// The recipe a bundled config name belongs to, or nullptr ("llama3_2/1B_lora" → lora_finetune_distributed).
const RecipeSpec* recipe_for_config_name(const std::string& config_name);

std::vector<std::string> bundled_config_names();  // sorted
// The YAML text of a bundled config ("llama3_2/1B_lora", with or without ".yaml"), or nullptr.
const std::string* bundled_config_text(const std::string& name);

// What `--config NAME|FILE` names: a bundled config if the name is one (torchtune's rule:
// registered names win), else a YAML file on disk. Throws ktune::Error naming the argument,
// with the nearest bundled name, when it is neither.
struct ConfigSource {
  std::string name;    // the bundled name, or the path
  std::string text;    // the YAML
  bool bundled = false;
};
ConfigSource find_config(const std::string& name_or_file);

}  // namespace ktune::train
