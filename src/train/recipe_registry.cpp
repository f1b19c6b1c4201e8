// Recipes and bundled configs. See recipe_registry.h. The config texts come from
// bundled_configs.cpp, which the build generates from configs/ (config_bundle.cmake).
#include "train/recipe_registry.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>
#include <sys/stat.h>

#include "core/error.h"
#include "train/config_suggest.h"

namespace ktune::train {

struct BundledConfig {
  const char* name;  // "llama3_2/1B_lora" (path under configs/ without .yaml)
  const char* text;
};
extern const BundledConfig kBundledConfigs[];
extern const std::size_t kBundledConfigCount;

static const std::map<std::string, std::string>& bundled() {
  static const std::map<std::string, std::string> configs = [] {
    std::map<std::string, std::string> m;
    for (std::size_t i = 0; i < kBundledConfigCount; ++i) m[kBundledConfigs[i].name] = kBundledConfigs[i].text;
    return m;
  }();
  return configs;
}

// "llama3_2/1B_lora_single_device" → "lora_single_device"; "tiny/lora_single_device" → the same.
static std::string variant_of(const std::string& name) {
  static const std::vector<std::string> kVariants = {"full_single_device", "full_multinode", "full",
                                                     "lora_single_device", "qlora_single_device",
                                                     "lora", "qlora"};
  std::string base = name.substr(name.rfind('/') == std::string::npos ? 0 : name.rfind('/') + 1);
  for (const std::string& v : kVariants)
    if (base == v || (base.size() > v.size() && base.compare(base.size() - v.size() - 1, v.size() + 1, "_" + v) == 0 &&
                      base.find('_') == base.size() - v.size() - 1))
      return v;
  return "";
}

static std::string recipe_name_for_variant(const std::string& v) {
  if (v == "full_single_device") return "full_finetune_single_device";
  if (v == "full" || v == "full_multinode") return "full_finetune_distributed";
  if (v == "lora_single_device" || v == "qlora_single_device") return "lora_finetune_single_device";
  if (v == "lora" || v == "qlora") return "lora_finetune_distributed";
  return "";
}

const std::vector<RecipeSpec>& all_recipes() {
  static const std::vector<RecipeSpec> recipes = [] {
    std::vector<RecipeSpec> r = {{"full_finetune_single_device", false, false, {}},
                                 {"full_finetune_distributed", false, true, {}},
                                 {"lora_finetune_single_device", true, false, {}},
                                 {"lora_finetune_distributed", true, true, {}}};
    for (const auto& [name, text] : bundled()) {
      std::string recipe = recipe_name_for_variant(variant_of(name));
      for (RecipeSpec& spec : r)
        if (spec.name == recipe) spec.configs.push_back(name);
    }
    return r;
  }();
  return recipes;
}

const RecipeSpec* find_recipe(const std::string& name) {
  for (const RecipeSpec& r : all_recipes())
    if (r.name == name) return &r;
  return nullptr;
}

const RecipeSpec* recipe_for_config_name(const std::string& config_name) {
  std::string v = variant_of(config_name);
  return v.empty() ? nullptr : find_recipe(recipe_name_for_variant(v));
}

std::vector<std::string> bundled_config_names() {
  std::vector<std::string> names;
  for (const auto& [name, text] : bundled()) names.push_back(name);
  return names;
}

static std::string strip_yaml_suffix(const std::string& name) {
  if (name.size() > 5 && name.compare(name.size() - 5, 5, ".yaml") == 0) return name.substr(0, name.size() - 5);
  return name;
}

const std::string* bundled_config_text(const std::string& name) {
  auto it = bundled().find(strip_yaml_suffix(name));
  return it == bundled().end() ? nullptr : &it->second;
}

// As torchtune: a bundled config's exact name is that config; anything else is a path. A name with
// ".yaml" is the bundled config only when no such file exists: `ktune cp NAME NAME.yaml`, then an edit,
// then `--config NAME.yaml` runs the edited copy.
ConfigSource find_config(const std::string& name_or_file) {
  if (auto it = bundled().find(name_or_file); it != bundled().end()) return {name_or_file, it->second, true};
  struct stat st{};
  if (::stat(name_or_file.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
    if (const std::string* text = bundled_config_text(name_or_file)) return {strip_yaml_suffix(name_or_file), *text, true};
  if (::stat(name_or_file.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
    std::ifstream in(name_or_file, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    if (!in.good() && !in.eof()) throw Error(name_or_file, "cannot read config file");
    return {name_or_file, ss.str(), false};
  }
  throw Error(name_or_file, "neither a bundled config (see `ktune ls`) nor a readable file" +
                  did_you_mean(strip_yaml_suffix(name_or_file), bundled_config_names()));
}

}  // namespace ktune::train
