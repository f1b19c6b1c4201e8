// The recipe and config table (upstream's getRecipeAndConfig) and torchtune's config set per model.
// The config set is torchtune 0.6.1's recipe registry (torchtune/_recipe_registry.py) restricted to
// the catalog's models; tests/runtime/fixtures/torchtune_configs.json, made from the wheel by the
// script beside it, proves the copy. It holds no policy about what is allowed (validation.h does).
#include "runtime/recipe_table.h"

#include <algorithm>
#include <cctype>
#include <utility>

namespace ktune {

namespace {

struct ModelConfigs {
  std::string model_key;
  std::vector<TorchTuneConfigEntry> configs;
};

const std::vector<ModelConfigs>& config_table() {
  static const std::vector<ModelConfigs> table{
      {"llama3_2/1B",
       {{"llama3_2/1B_full", "full_finetune_distributed"},
        {"llama3_2/1B_full_single_device", "full_finetune_single_device"},
        {"llama3_2/1B_lora", "lora_finetune_distributed"},
        {"llama3_2/1B_lora_single_device", "lora_finetune_single_device"},
        {"llama3_2/1B_qat_lora", "qat_lora_finetune_distributed"},
        {"llama3_2/1B_qlora_single_device", "lora_finetune_single_device"}}},
      {"llama3_2/3B",
       {{"llama3_2/3B_full", "full_finetune_distributed"},
        {"llama3_2/3B_full_single_device", "full_finetune_single_device"},
        {"llama3_2/3B_lora", "lora_finetune_distributed"},
        {"llama3_2/3B_lora_single_device", "lora_finetune_single_device"},
        {"llama3_2/3B_qat_lora", "qat_lora_finetune_distributed"},
        {"llama3_2/3B_qlora_single_device", "lora_finetune_single_device"}}},
      {"llama3_1/8B",
       {{"llama3_1/8B_full", "full_finetune_distributed"},
        {"llama3_1/8B_full_dpo", "full_dpo_distributed"},
        {"llama3_1/8B_full_single_device", "full_finetune_single_device"},
        {"llama3_1/8B_lora", "lora_finetune_distributed"},
        {"llama3_1/8B_lora_dpo", "lora_dpo_distributed"},
        {"llama3_1/8B_lora_dpo_single_device", "lora_dpo_single_device"},
        {"llama3_1/8B_lora_single_device", "lora_finetune_single_device"},
        {"llama3_1/8B_qat_lora", "qat_lora_finetune_distributed"},
        {"llama3_1/8B_qlora_single_device", "lora_finetune_single_device"}}},
      {"llama3_1/70B",
       {{"llama3_1/70B_full", "full_finetune_distributed"},
        {"llama3_1/70B_generation_distributed", "dev/generate_v2_distributed"},
        {"llama3_1/70B_lora", "lora_finetune_distributed"}}},
      {"llama3_3/70B",
       {{"llama3_3/70B_full", "full_finetune_distributed"},
        {"llama3_3/70B_full_multinode", "full_finetune_distributed"},
        {"llama3_3/70B_generation_distributed", "dev/generate_v2_distributed"},
        {"llama3_3/70B_lora", "lora_finetune_distributed"},
        {"llama3_3/70B_qlora", "lora_finetune_distributed"}}},
      {"qwen2_5/0.5B",
       {{"qwen2_5/0.5B_full", "full_finetune_distributed"},
        {"qwen2_5/0.5B_full_single_device", "full_finetune_single_device"},
        {"qwen2_5/0.5B_lora", "lora_finetune_distributed"},
        {"qwen2_5/0.5B_lora_single_device", "lora_finetune_single_device"}}},
      {"qwen2_5/1.5B",
       {{"qwen2_5/1.5B_full", "full_finetune_distributed"},
        {"qwen2_5/1.5B_full_single_device", "full_finetune_single_device"},
        {"qwen2_5/1.5B_lora", "lora_finetune_distributed"},
        {"qwen2_5/1.5B_lora_single_device", "lora_finetune_single_device"}}},
      {"qwen2_5/3B",
       {{"qwen2_5/3B_full", "full_finetune_distributed"},
        {"qwen2_5/3B_full_single_device", "full_finetune_single_device"},
        {"qwen2_5/3B_lora", "lora_finetune_distributed"},
        {"qwen2_5/3B_lora_single_device", "lora_finetune_single_device"}}},
      {"qwen2_5/7B",
       {{"qwen2_5/7B_full", "full_finetune_distributed"},
        {"qwen2_5/7B_full_single_device", "full_finetune_single_device"},
        {"qwen2_5/7B_lora", "lora_finetune_distributed"},
        {"qwen2_5/7B_lora_single_device", "lora_finetune_single_device"}}},
      {"gemma2/2B",
       {{"gemma2/2B_full", "full_finetune_distributed"},
        {"gemma2/2B_lora", "lora_finetune_distributed"},
        {"gemma2/2B_lora_single_device", "lora_finetune_single_device"},
        {"gemma2/2B_qlora_single_device", "lora_finetune_single_device"}}},
      {"gemma2/9B",
       {{"gemma2/9B_full", "full_finetune_distributed"},
        {"gemma2/9B_lora", "lora_finetune_distributed"},
        {"gemma2/9B_lora_single_device", "lora_finetune_single_device"},
        {"gemma2/9B_qlora_single_device", "lora_finetune_single_device"}}},
      {"gemma2/27B",
       {{"gemma2/27B_full", "full_finetune_distributed"},
        {"gemma2/27B_lora", "lora_finetune_distributed"},
        {"gemma2/27B_lora_single_device", "lora_finetune_single_device"},
        {"gemma2/27B_qlora_single_device", "lora_finetune_single_device"}}},
      {"mistral/7B",
       {{"mistral/7B_full", "full_finetune_distributed"},
        {"mistral/7B_full_low_memory", "full_finetune_single_device"},
        {"mistral/7B_full_ppo_low_memory", "ppo_full_finetune_single_device"},
        {"mistral/7B_lora", "lora_finetune_distributed"},
        {"mistral/7B_lora_single_device", "lora_finetune_single_device"},
        {"mistral/7B_qlora_single_device", "lora_finetune_single_device"}}},
  };
  return table;
}

// "key=value" -> (key, value); an arg without '=' has an empty value.
std::pair<std::string, std::string> split_arg(const std::string& arg) {
  const size_t eq = arg.find('=');
  if (eq == std::string::npos) return {arg, ""};
  return {arg.substr(0, eq), arg.substr(eq + 1)};
}

bool is_true(const std::string& v) { return v == "True" || v == "true" || v == "TRUE" || v == "1" || v == "yes"; }

}  // namespace

std::string model_key_from_runtime_name(const std::string& runtime_name) {
  std::vector<std::string> fields;
  size_t start = 0;
  while (true) {
    const size_t dash = runtime_name.find('-', start);
    fields.push_back(runtime_name.substr(start, dash == std::string::npos ? std::string::npos : dash - start));
    if (dash == std::string::npos) break;
    start = dash + 1;
  }
  if (fields.size() != 3) return "";
  std::string family = fields[1];
  std::replace(family.begin(), family.end(), '.', '_');
  std::string size = fields[2];
  for (char& c : size) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return family + "/" + size;
}

// Upstream tests `strings.Contains(arg, "model.lora_attn_modules")`; the SDK always renders that
// key for a LoraConfig. We compare the key, so that a value mentioning it does not count.
bool args_enable_lora(const std::vector<std::string>& args) {
  for (const std::string& a : args)
    if (split_arg(a).first == "model.lora_attn_modules") return true;
  return false;
}

// upstream-compat.md: QLoRA = model.quantize_base true and model.use_dora not true. (Upstream's
// code tests only that the keys appear, so `model.quantize_base=False` counted as QLoRA there.)
bool args_enable_qlora(const std::vector<std::string>& args) {
  bool quantize = false, dora = false;
  for (const std::string& a : args) {
    const auto [key, value] = split_arg(a);
    if (key == "model.quantize_base") quantize = is_true(value);
    if (key == "model.use_dora") dora = is_true(value);
  }
  return quantize && !dora;
}

RecipeChoice select_recipe(const std::string& model_key, int num_nodes, int num_proc_per_node,
                           const std::vector<std::string>& args, const ConfigSet& configs) {
  RecipeChoice c;
  const bool qlora = args_enable_qlora(args);
  const bool lora = args_enable_lora(args);
  if (num_nodes == 1 && num_proc_per_node == 1) {
    if (qlora) {
      c = {kLoraFinetuneSingleDevice, "_qlora_single_device", ""};
    } else if (lora) {
      c = {kLoraFinetuneSingleDevice, "_lora_single_device", ""};
    } else {
      c = {kFullFinetuneSingleDevice, "_full_single_device", ""};
    }
  } else if (num_nodes == 1 && qlora) {
    c = {kLoraFinetuneDistributed, "_qlora", ""};
  } else if (num_nodes == 1 && lora) {
    c = {kLoraFinetuneDistributed, "_lora", ""};
  } else if (num_nodes > 1) {
    c = {kFullFinetuneDistributed, "_full_multinode", ""};
  } else {
    c = {kFullFinetuneDistributed, "_full", ""};
  }
  c.config = model_key + c.suffix;
  // torchtune names Mistral's single-device full fine-tune `7B_full_low_memory`; the alias only
  // ever fills a gap.
  if (c.suffix == "_full_single_device" && !configs.contains(c.config) &&
      configs.contains(model_key + "_full_low_memory")) {
    c.suffix = "_full_low_memory";
    c.config = model_key + c.suffix;
  }
  return c;
}

const std::vector<TorchTuneConfigEntry>& torchtune_configs(const std::string& model_key) {
  static const std::vector<TorchTuneConfigEntry> none;
  for (const ModelConfigs& m : config_table())
    if (m.model_key == model_key) return m.configs;
  return none;
}

std::vector<std::string> supported_models() {
  std::vector<std::string> out;
  for (const ModelConfigs& m : config_table()) out.push_back(m.model_key);
  return out;
}

bool torchtune_config_exists(const std::string& config) { return ConfigSet::torchtune().contains(config); }

ConfigSet::ConfigSet(std::vector<std::string> configs, std::string source)
    : configs_(std::move(configs)), source_(std::move(source)) {
  std::sort(configs_.begin(), configs_.end());
  configs_.erase(std::unique(configs_.begin(), configs_.end()), configs_.end());
}

const ConfigSet& ConfigSet::torchtune() {
  static const ConfigSet set = [] {
    std::vector<std::string> all;
    for (const ModelConfigs& m : config_table())
      for (const TorchTuneConfigEntry& e : m.configs) all.push_back(e.config);
    return ConfigSet(all, "torchtune 0.6.1");
  }();
  return set;
}

const ConfigSet& ConfigSet::bundled() {
  static const ConfigSet set(bundled_config_names(), "ktune configs/");
  return set;
}

bool ConfigSet::contains(const std::string& config) const {
  return std::binary_search(configs_.begin(), configs_.end(), config);
}

std::vector<std::string> ConfigSet::for_model(const std::string& model_key) const {
  std::vector<std::string> out;
  for (const std::string& c : configs_)
    if (c.rfind(model_key + "_", 0) == 0) out.push_back(c);
  return out;
}

}  // namespace ktune
