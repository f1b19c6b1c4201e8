#include "model/adapters/peft_adapter_dir.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/safetensors.h"

namespace fs = std::filesystem;

namespace ktune::model {

namespace {

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(path, "cannot be read (a PEFT adapter directory holds adapter_config.json)");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(path, std::string("not JSON: ") + e.what());
  }
}

// The key's value when it is present and not null; else nullptr.
const nlohmann::json* value_of(const nlohmann::json& config, const char* key) {
  auto it = config.find(key);
  return it == config.end() || it->is_null() ? nullptr : &*it;
}

// Keys whose non-default values this loader cannot honour.
void refuse_unsupported(const nlohmann::json& config, const std::string& path) {
  auto where = [&](const char* key) { return path + ": " + key; };
  if (auto v = value_of(config, "fan_in_fan_out"); v && v->is_boolean() && v->get<bool>())
    throw Error(where("fan_in_fan_out"), "true (Conv1D-style weights) is not supported; Llama-family projections are Linear");
  if (auto v = value_of(config, "bias"); v && *v != "none")
    throw Error(where("bias"), "'" + v->dump() + "' is not supported: only adapters without trained biases (\"none\")");
  if (auto v = value_of(config, "modules_to_save"); v && !v->empty())
    throw Error(where("modules_to_save"), "whole modules saved beside the adapter are not supported");
  for (const char* key : {"rank_pattern", "alpha_pattern"})
    if (auto v = value_of(config, key); v && !v->empty())
      throw Error(where(key), "per-module ranks and alphas are not supported");
  if (auto v = value_of(config, "lora_bias"); v && v->is_boolean() && v->get<bool>())
    throw Error(where("lora_bias"), "true (a trained bias on lora_B) is not supported");
  for (const char* key : {"layers_to_transform", "layer_replication", "exclude_modules", "target_parameters",
                          "trainable_token_indices", "alora_invocation_tokens"})
    if (auto v = value_of(config, key); v && !v->empty())
      throw Error(where(key), v->dump() + " is not supported (ktune loads adapters on whole projections of every layer)");
}

}  // namespace

PeftAdapterConfig read_peft_adapter_config(const std::string& dir) {
  const std::string path = (fs::path(dir) / "adapter_config.json").string();
  const nlohmann::json config = read_json(path);
  if (!config.is_object()) throw Error(path, "expected a JSON object");
  auto where = [&](const char* key) { return path + ": " + key; };
  const nlohmann::json* type = value_of(config, "peft_type");
  if (!type || *type != "LORA")
    throw Error(where("peft_type"), (type ? type->dump() : std::string("absent")) + "; ktune loads LORA adapters (LoRA, rsLoRA, DoRA)");
  refuse_unsupported(config, path);

  PeftAdapterConfig result;
  const nlohmann::json* r = value_of(config, "r");
  if (!r || !r->is_number_integer() || r->get<int64_t>() < 1) throw Error(where("r"), "expected a positive integer rank");
  result.options.rank = r->get<int64_t>();
  const nlohmann::json* alpha = value_of(config, "lora_alpha");
  if (!alpha || !alpha->is_number()) throw Error(where("lora_alpha"), "expected a number");
  result.options.alpha = alpha->get<float>();
  if (auto v = value_of(config, "use_dora")) result.options.use_dora = v->get<bool>();
  if (auto v = value_of(config, "use_rslora")) result.options.use_rslora = v->get<bool>();
  result.options.dropout = 0.0f;                  // inference: PEFT's dropout is off in eval mode
  result.options.dora_magnitudes_later = true;    // the magnitudes come from the file

  const nlohmann::json* targets = value_of(config, "target_modules");
  if (targets && targets->is_string()) {  // a regular expression (PEFT: re.fullmatch over each module's name)
    const std::string pattern = targets->get<std::string>();
    if (pattern == "all-linear")
      throw Error(where("target_modules"), "\"all-linear\" is PEFT's shorthand, which its save_pretrained writes out as "
                                           "the module names; list them");
    try {
      std::regex check(pattern);
    } catch (const std::regex_error& e) {
      throw Error(where("target_modules"), "the regular expression '" + pattern + "' is not one ktune reads (ECMAScript "
                                           "syntax): " + e.what());
    }
    result.target_regex = pattern;
    return result;
  }
  if (!targets || !targets->is_array() || targets->empty())
    throw Error(where("target_modules"), "expected a list of module names or a regular expression");
  for (const auto& t : *targets) {
    if (!t.is_string()) throw Error(where("target_modules"), "expected module names, got " + t.dump());
    result.target_modules.push_back(t.get<std::string>());
  }
  return result;
}

namespace {

// One target_modules entry of a list, by PEFT's rule: the module's whole name, or a dotted suffix of it.
bool entry_names(const std::string& entry, const std::string& name) {
  return name == entry || name.ends_with("." + entry);
}

}  // namespace

bool peft_targets(const PeftAdapterConfig& config, const std::string& name) {
  if (config.target_regex) return std::regex_match(name, std::regex(*config.target_regex));
  return std::any_of(config.target_modules.begin(), config.target_modules.end(),
                     [&](const std::string& entry) { return entry_names(entry, name); });
}

std::vector<std::shared_ptr<LoraAdapter>> load_peft_adapter(Decoder& decoder, const std::string& dir) {
  const PeftAdapterConfig config = read_peft_adapter_config(dir);
  const std::string config_path = (fs::path(dir) / "adapter_config.json").string();
  const std::string weights_path = (fs::path(dir) / "adapter_model.safetensors").string();
  if (!fs::exists(weights_path)) throw Error(weights_path, "missing: the adapter's weights");
  const io::SafetensorsFile file = io::SafetensorsFile::open(weights_path);

  if (decoder.config().tie_word_embeddings && peft_targets(config, "lm_head"))
    throw Error(config_path + ": target_modules",
                "names lm_head, but this model ties its output layer to the embeddings (no projection of its own)");
  std::vector<std::shared_ptr<LoraAdapter>> adapters;
  std::set<std::string> matched, used;  // the list entries that named a projection; the tensors taken
  for (Linear* linear : decoder.linears()) {
    if (!peft_targets(config, linear->name)) continue;
    for (const std::string& t : config.target_modules)
      if (entry_names(t, linear->name)) matched.insert(t);
    auto adapter = std::make_shared<LoraAdapter>(*linear, config.options);
    for (Parameter* p : adapter->parameters()) {
      if (!file.contains(p->name)) throw Error(weights_path, "has no tensor " + p->name + " (the adapter of " + linear->name + ")");
      Tensor value = file.to_f32(p->name);
      if (value.shape() != p->value.shape())
        throw Error(weights_path, p->name + " is " + value.shape().str() + ", the model's " + linear->name + " with r = " +
                                      std::to_string(config.options.rank) + " needs " + p->value.shape().str());
      p->value.copy_from(value);
      used.insert(p->name);
    }
    // PEFT saves the base weight of a targeted output layer beside its adapter (save_embedding_layers,
    // "<module>.base_layer.weight") and loads it over the base's: so here.
    const std::string saved_base = "base_model.model." + linear->name + ".base_layer.weight";
    if (file.contains(saved_base)) {
      Tensor value = file.to_f32(saved_base);
      if (value.shape() != linear->weight->value.shape())
        throw Error(weights_path, saved_base + " is " + value.shape().str() + ", the model's " + linear->name + " is " +
                                      linear->weight->value.shape().str());
      linear->weight->value.copy_from(value);
      used.insert(saved_base);
    }
    linear->adapter = adapter;
    adapters.push_back(adapter);
  }
  for (const std::string& t : config.target_modules)
    if (!matched.count(t)) throw Error(config_path + ": target_modules", "'" + t + "' matches no projection of this model");
  if (config.target_regex && adapters.empty())
    throw Error(config_path + ": target_modules", "'" + *config.target_regex + "' matches no projection of this model");
  for (const std::string& name : file.names())
    if (!used.count(name)) throw Error(weights_path, "holds " + name + ", which no targeted projection of this model takes");
  decoder.adapters_changed();
  return adapters;
}

}  // namespace ktune::model
