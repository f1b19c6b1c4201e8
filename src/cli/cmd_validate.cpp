// `ktune validate CONFIG|FILE [--recipe RECIPE] [key=value ...]`: runs everything `ktune run` does
// before loading anything (overrides, ${…} interpolation, the recipe's schema) and prints
// "Config is well-formed!" as torchtune does, or every problem with its key, and exits 1.
// The recipe is the one a bundled config belongs to, else --recipe, else guessed from the file
// (a lora_ builder → a LoRA recipe; FSDP keys or a distributed-looking name → distributed).
#include <cstdio>
#include <string>

#include "cli/command_table.h"
#include "cli/flag_args.h"
#include "core/error.h"
#include "train/component_registry.h"
#include "train/config.h"
#include "train/config_suggest.h"
#include "train/recipe_config.h"
#include "train/recipe_registry.h"

namespace ktune::cli {

static const train::RecipeSpec& guess_recipe(const std::string& name) {
  if (const train::RecipeSpec* r = train::recipe_for_config_name(name)) return *r;
  std::string base = name.substr(name.rfind('/') == std::string::npos ? 0 : name.rfind('/') + 1);
  if (base.size() > 5 && base.compare(base.size() - 5, 5, ".yaml") == 0) base.resize(base.size() - 5);
  if (const train::RecipeSpec* r = train::recipe_for_config_name(base)) return *r;
  train::ConfigSource source = train::find_config(name);
  train::ConfigNode tree = train::load_config_yaml(source.text, source.name);
  const train::ConfigNode* model = tree.find("model");
  const train::ComponentSpec* c = model && model->is_map() ? train::find_component(model->component()) : nullptr;
  bool lora = c != nullptr && c->adapter != train::AdapterKind::None;
  bool distributed = false;
  for (const char* key : {"fsdp_cpu_offload", "fsdp_reshard_after_forward", "custom_sharded_layers", "dataset_val",
                          "run_val_every_n_steps"})
    if (tree.contains(key)) distributed = true;
  return *train::find_recipe(std::string(lora ? "lora_finetune_" : "full_finetune_") +
                             (distributed ? "distributed" : "single_device"));
}

int cmd_validate(const Args& args) {
  std::string name, recipe_name;
  std::vector<std::string> overrides;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (is_help_flag(a)) {
      std::printf("usage: ktune validate CONFIG|FILE [--recipe RECIPE] [key=value | ~key ...]\n\n"
                  "Check a config (with overrides) against its recipe without loading anything.\n");
      return 0;
    } else if (a == "--recipe" && i + 1 < args.size()) {
      recipe_name = args[++i];
    } else if (a.rfind("--recipe=", 0) == 0) {
      recipe_name = a.substr(9);
    } else if ((a == "--config" && i + 1 < args.size()) || a.rfind("--config=", 0) == 0) {  // as `ktune run` takes it
      const std::string given = a == "--config" ? args[++i] : a.substr(9);
      if (!name.empty()) throw Error("--config " + given, "given twice (first: " + name + "): validate takes one config");
      name = given;
    } else if (a.rfind("--", 0) == 0) {
      throw Error("ktune validate", "unknown option `" + a + "` (option: --recipe RECIPE)");
    } else if (name.empty() && a.find('=') == std::string::npos && a.rfind("~", 0) != 0) {
      name = a;
    } else {
      overrides.push_back(a);
    }
  }
  if (name.empty()) throw Error("ktune validate", "usage: ktune validate CONFIG|FILE [--recipe RECIPE] [key=value ...]");
  const train::RecipeSpec* recipe = nullptr;
  if (!recipe_name.empty()) {
    recipe = train::find_recipe(recipe_name);
    if (recipe == nullptr) {
      std::vector<std::string> names;
      for (const auto& r : train::all_recipes()) names.push_back(r.name);
      throw Error("--recipe " + recipe_name, "unknown recipe" + train::did_you_mean(recipe_name, names));
    }
  } else {
    recipe = &guess_recipe(name);
  }
  train::prepare_config_tree(*recipe, name, overrides);
  std::printf("Config is well-formed!\n");
  return 0;
}

}  // namespace ktune::cli
