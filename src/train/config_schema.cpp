// The per-recipe schema and the checks. See config_schema.h.
#include "train/config_schema.h"
#include "train/prompt_templates.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "train/component_registry.h"
#include "train/config_suggest.h"

namespace ktune::train {

namespace {

enum class Scope { All, Lora, Full, Distributed, SingleDevice };

struct TopKey {
  std::string name;
  ParamSpec spec;
  Scope scope = Scope::All;
};

struct Slot {
  std::string name;
  ComponentKind kind;
  bool required;
  Scope scope = Scope::All;
};

constexpr double kInf = std::numeric_limits<double>::infinity();

ParamSpec spec(ParamType type, bool nullable = false, double min = -kInf, std::vector<std::string> allowed = {},
               bool required = false) {
  ParamSpec p;
  p.type = type;
  p.nullable = nullable;
  p.min = min;
  p.allowed = std::move(allowed);
  p.required = required;
  return p;
}

const std::vector<TopKey>& top_keys() {
  static const std::vector<TopKey> keys = {
      {"output_dir", spec(ParamType::String, false, -kInf, {}, true)},
      {"seed", spec(ParamType::Int, true, 0)},
      {"shuffle", spec(ParamType::Bool)},
      {"batch_size", spec(ParamType::Int, false, 1, {}, true)},
      {"epochs", spec(ParamType::Int, false, 1, {}, true)},
      {"max_steps_per_epoch", spec(ParamType::Int, true, 1)},
      {"gradient_accumulation_steps", spec(ParamType::Int, false, 1)},
      {"clip_grad_norm", spec(ParamType::FloatLike, true)},
      {"compile", spec(ParamType::Bool)},
      {"log_every_n_steps", spec(ParamType::Int, false, 1)},
      {"log_peak_memory_stats", spec(ParamType::Bool)},
      {"device", spec(ParamType::String, false, -kInf, {"cpu", "cuda"})},
      {"dtype", spec(ParamType::String, false, -kInf, {"bf16", "fp32"})},
      {"enable_activation_checkpointing", spec(ParamType::Bool)},
      {"enable_activation_offloading", spec(ParamType::Bool)},
      {"resume_from_checkpoint", spec(ParamType::Bool)},
      {"save_every_n_steps", spec(ParamType::Int, true, 1)},
      {"optimizer_in_bwd", spec(ParamType::Bool), Scope::Full},
      {"save_adapter_weights_only", spec(ParamType::Bool), Scope::Lora},
      {"low_cpu_ram", spec(ParamType::Bool), Scope::SingleDevice},
      {"fsdp_cpu_offload", spec(ParamType::Bool), Scope::Distributed},
      {"fsdp_reshard_after_forward", spec(ParamType::Bool), Scope::Distributed},
      {"custom_sharded_layers", spec(ParamType::StringList, true), Scope::Distributed},
      {"run_val_every_n_steps", spec(ParamType::Int, true, 1), Scope::Distributed},
  };
  return keys;
}

const std::vector<Slot>& slots() {
  static const std::vector<Slot> s = {
      {"model", ComponentKind::Model, true},
      {"tokenizer", ComponentKind::Tokenizer, true},
      {"checkpointer", ComponentKind::Checkpointer, true},
      {"dataset", ComponentKind::Dataset, true},
      {"optimizer", ComponentKind::Optimizer, true},
      {"lr_scheduler", ComponentKind::LrScheduler, false},
      {"loss", ComponentKind::Loss, true},
      {"metric_logger", ComponentKind::MetricLogger, false},
      {"profiler", ComponentKind::Profiler, false},
      {"dataset_val", ComponentKind::Dataset, false, Scope::Distributed},
  };
  return s;
}

bool in_scope(Scope scope, const RecipeSpec& r) {
  switch (scope) {
    case Scope::All: return true;
    case Scope::Lora: return r.lora;
    case Scope::Full: return !r.lora;
    case Scope::Distributed: return r.distributed;
    case Scope::SingleDevice: return !r.distributed;
  }
  return false;
}

const char* scope_phrase(Scope scope) {
  switch (scope) {
    case Scope::Lora: return "only LoRA recipes (lora_finetune_*) accept it";
    case Scope::Full: return "only full fine-tuning recipes (full_finetune_*) accept it";
    case Scope::Distributed: return "only distributed recipes (*_distributed) accept it";
    case Scope::SingleDevice: return "only single-device recipes (*_single_device) accept it";
    default: return "";
  }
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + v[i];
  return out;
}

class Checker {
 public:
  Checker(const ConfigNode& tree, const RecipeSpec& recipe) : tree_(tree), recipe_(recipe) {}

  std::vector<Error> run() {
    if (!tree_.is_map()) {
      add("config", "a config must be a mapping");
      return errors_;
    }
    check_top_level();
    check_combinations();
    return errors_;
  }

 private:
  // An error at `key`, led by where its value was written (file:line, or the override) when known.
  void add(const std::string& key, const std::string& what) {
    const ConfigNode* node = tree_.find_path(key);
    const std::string origin = node != nullptr ? node->origin() : "";
    errors_.emplace_back((origin.empty() ? "" : origin + ": ") + "config key " + key, what);
  }

  // Checks one value against a parameter spec.
  void check_value(const std::string& key, const ConfigNode& v, const ParamSpec& p) {
    if (v.is_null()) {
      if (!p.nullable && p.type != ParamType::Any)
        add(key, std::string("expected ") + param_type_name(p.type) + ", got null" +
                     (p.required ? " (it is required)" : ""));
      return;
    }
    auto got = [&] { return std::string(", got ") + v.kind_name() + " " + v.to_inline(); };
    switch (p.type) {
      case ParamType::Bool:
        if (!v.is_bool()) add(key, std::string("expected a bool (true/false)") + got());
        return;
      case ParamType::Int:
        if (!v.is_int()) {
          add(key, std::string("expected an int") + range_text(p) + got());
          return;
        }
        check_range(key, static_cast<double>(v.as_int()), p);
        return;
      case ParamType::Float:
        if (!v.is_number()) {
          add(key, std::string("expected a float") + range_text(p) + got());
          return;
        }
        check_range(key, v.as_float(), p);
        return;
      case ParamType::FloatLike: {
        double x = 0;
        if (v.is_number()) {
          x = v.as_float();
        } else if (v.is_string()) {
          char* end = nullptr;
          x = std::strtod(v.as_string().c_str(), &end);
          if (v.as_string().empty() || *end != '\0') {
            add(key, std::string("expected a float (or inf)") + got());
            return;
          }
        } else {
          add(key, std::string("expected a float (or inf)") + got());
          return;
        }
        if (!(x > 0)) add(key, "expected a positive float (or inf), got " + v.to_inline());
        return;
      }
      case ParamType::String:
        if (!v.is_string()) {
          add(key, std::string("expected a string") + allowed_text(p) + got());
          return;
        }
        check_allowed(key, v.as_string(), p);
        return;
      case ParamType::StringList:
        if (!v.is_list()) {
          add(key, std::string("expected a list of strings") + allowed_text(p) + got());
          return;
        }
        for (std::size_t i = 0; i < v.items().size(); ++i) {
          const ConfigNode& item = v.items()[i];
          if (!item.is_string()) {
            add(key + "." + std::to_string(i), std::string("expected a string, got ") + item.kind_name() + " " + item.to_inline());
            continue;
          }
          check_allowed(key, item.as_string(), p);
          // A choice from a fixed set (the adapted modules) listed twice is a typo, not a wish.
          for (std::size_t j = 0; !p.allowed.empty() && j < i; ++j)
            if (v.items()[j].is_string() && v.items()[j].as_string() == item.as_string()) {
              add(key, "lists '" + item.as_string() + "' twice (items " + std::to_string(j) + " and " +
                           std::to_string(i) + ")");
              break;
            }
        }
        return;
      case ParamType::StringOrList:
        if (v.is_string()) return;
        if (v.is_list()) {
          for (const ConfigNode& item : v.items())
            if (!item.is_string()) add(key, std::string("expected a string or a list of strings") + got());
          return;
        }
        add(key, std::string("expected a string or a list of strings") + got());
        return;
      case ParamType::StringMap:
        if (!v.is_map()) {
          add(key, std::string("expected a map of string to string such as {'input': 'question'}") + got());
          return;
        }
        for (const auto& [k, item] : v.entries())
          if (!item.is_string())
            add(key + "." + k, std::string("expected a string, got ") + item.kind_name() + " " + item.to_inline());
        return;
      case ParamType::CheckpointFiles:
        if (v.is_list()) {
          if (v.items().empty()) add(key, "expected at least one checkpoint file");
          for (const ConfigNode& item : v.items())
            if (!item.is_string()) add(key, std::string("expected file names (strings)") + got());
          return;
        }
        if (v.is_map()) {
          const ConfigNode* format = v.find("filename_format");
          const ConfigNode* max = v.find("max_filename");
          for (const auto& [k, item] : v.entries())
            if (k != "filename_format" && k != "max_filename")
              add(key + "." + k, "unknown key" + did_you_mean(k, {"filename_format", "max_filename"}));
          if (format == nullptr || !format->is_string() ||
              format->as_string().find("{}") == std::string::npos ||
              format->as_string().find("{}", format->as_string().find("{}") + 2) == std::string::npos)
            add(key + ".filename_format", "expected a string with two {} such as model-{}-of-{}.safetensors");
          if (max == nullptr || !max->is_string() || max->as_string().empty() ||
              max->as_string().find_first_not_of("0123456789") != std::string::npos)
            add(key + ".max_filename",
                std::string("expected a quoted string of digits such as \"00030\"") +
                    (max != nullptr && max->is_int() ? " (unquoted it reads as an octal or decimal int)" : ""));
          return;
        }
        add(key, std::string("expected ") + param_type_name(p.type) + got());
        return;
      case ParamType::FloatPair:
        if (!v.is_list() || v.items().size() != 2 || !v.items()[0].is_number() || !v.items()[1].is_number()) {
          add(key, std::string("expected a list of two floats such as [0.9, 0.999]") + got());
          return;
        }
        check_range(key + ".0", v.items()[0].as_float(), p);
        check_range(key + ".1", v.items()[1].as_float(), p);
        return;
      case ParamType::Any:
        return;
    }
  }

  static std::string range_text(const ParamSpec& p) {
    if (p.min == -kInf && p.max == kInf) return "";
    char buf[96];
    if (p.max == kInf) {
      std::snprintf(buf, sizeof buf, " >= %g", p.min);
    } else {
      std::snprintf(buf, sizeof buf, " in [%g, %g%s", p.min, p.max, p.max_exclusive ? ")" : "]");
    }
    return buf;
  }

  static std::string allowed_text(const ParamSpec& p) {
    return p.allowed.empty() ? "" : " (one of " + join(p.allowed) + ")";
  }

  void check_range(const std::string& key, double x, const ParamSpec& p) {
    bool above = p.max_exclusive ? x >= p.max : x > p.max;
    if (x < p.min || above || std::isnan(x)) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%g", x);
      add(key, std::string("expected ") + (p.type == ParamType::Int ? "an int" : "a float") + range_text(p) +
                   ", got " + buf);
    }
  }

  void check_allowed(const std::string& key, const std::string& s, const ParamSpec& p) {
    if (p.allowed.empty() || std::find(p.allowed.begin(), p.allowed.end(), s) != p.allowed.end()) return;
    if (key == "dtype" && (s == "fp16" || s == "float16" || s == "half"))
      add(key, "fp16 is not supported (torchtune refuses it too): use bf16 or fp32");
    else
      add(key, "`" + s + "` is not one of " + join(p.allowed) + did_you_mean(s, p.allowed));
  }

  std::vector<std::string> valid_top_level() const {
    std::vector<std::string> out;
    for (const TopKey& k : top_keys())
      if (in_scope(k.scope, recipe_)) out.push_back(k.name);
    for (const Slot& s : slots())
      if (in_scope(s.scope, recipe_)) out.push_back(s.name);
    return out;
  }

  void check_top_level() {
    std::vector<std::string> valid = valid_top_level();
    for (const auto& [key, value] : tree_.entries()) {
      const TopKey* top = nullptr;
      for (const TopKey& k : top_keys())
        if (k.name == key) top = &k;
      const Slot* slot = nullptr;
      for (const Slot& s : slots())
        if (s.name == key) slot = &s;
      Scope scope = top ? top->scope : slot ? slot->scope : Scope::All;
      if (!top && !slot) {
        add(key, "unknown key for recipe " + recipe_.name + did_you_mean(key, valid));
      } else if (!in_scope(scope, recipe_)) {
        add(key, "not accepted by recipe " + recipe_.name + ": " + scope_phrase(scope));
      } else if (top) {
        check_value(key, value, top->spec);
      } else if (slot->kind == ComponentKind::Dataset && value.is_list()) {
        if (value.items().empty()) add(key, "expected a dataset component or a non-empty list of them");
        for (std::size_t i = 0; i < value.items().size(); ++i)
          check_component(key + "." + std::to_string(i), value.items()[i], slot->kind);
      } else {
        check_component(key, value, slot->kind);
      }
    }
    for (const TopKey& k : top_keys())
      if (k.spec.required && in_scope(k.scope, recipe_) && !tree_.contains(k.name))
        add(k.name, std::string("missing: recipe ") + recipe_.name + " requires it (" + param_type_name(k.spec.type) + ")");
    for (const Slot& s : slots())
      if (s.required && in_scope(s.scope, recipe_) && !tree_.contains(s.name))
        add(s.name, std::string("missing: recipe ") + recipe_.name + " requires a " + component_kind_name(s.kind) +
                        " component (a map with _component_)");
  }

  void check_component(const std::string& key, const ConfigNode& node, ComponentKind kind) {
    if (node.is_null() && !(key == "dataset" || key == "model" || key == "tokenizer" || key == "checkpointer" ||
                            key == "optimizer" || key == "loss"))
      return;  // an optional component set to null is absent
    if (!node.is_map()) {
      add(key, std::string("expected a ") + component_kind_name(kind) + " component (a map with _component_), got " +
                   node.kind_name() + " " + node.to_inline());
      return;
    }
    const ConfigNode* path_node = node.find("_component_");
    if (path_node == nullptr || !path_node->is_string()) {
      add(key + "._component_", std::string("missing: name the ") + component_kind_name(kind) +
                                    ", e.g. " + component_paths(kind).front());
      return;
    }
    const std::string& path = path_node->as_string();
    const ComponentSpec* c = find_component(path);
    if (c == nullptr) {
      add(key + "._component_", std::string("unknown ") + component_kind_name(kind) + " `" + path + "`" +
                                    did_you_mean(path, component_paths(kind)));
      return;
    }
    if (c->kind != kind) {
      add(key + "._component_", "`" + path + "` is a " + component_kind_name(c->kind) + ", not a " +
                                    component_kind_name(kind));
      return;
    }
    if (!c->unsupported.empty()) {
      add(key + "._component_", "`" + path + "` is not supported by ktune: " + c->unsupported);
      return;
    }
    std::vector<std::string> valid;
    for (const ParamSpec& p : c->params) valid.push_back(key + "." + p.name);
    for (const auto& [k, v] : node.entries()) {
      if (k == "_component_") continue;
      const ParamSpec* p = c->param(k);
      if (p == nullptr) {
        add(key + "." + k, unknown_param_message(key, k, *c, valid));
        continue;
      }
      check_value(key + "." + k, v, *p);
    }
    for (const ParamSpec& p : c->params)
      if (p.required && !node.contains(p.name))
        add(key + "." + p.name, std::string("missing: ") + path + " requires it (" + param_type_name(p.type) + ")");
  }

  std::string unknown_param_message(const std::string& key, const std::string& k, const ComponentSpec& c,
                                    const std::vector<std::string>& valid) {
    static const std::vector<std::string> kLoraKeys = {"lora_attn_modules", "apply_lora_to_mlp", "apply_lora_to_output",
                                                       "lora_rank", "lora_alpha", "lora_dropout", "use_dora",
                                                       "quantize_base"};
    if (c.kind == ComponentKind::Model && c.adapter == AdapterKind::None &&
        std::find(kLoraKeys.begin(), kLoraKeys.end(), k) != kLoraKeys.end()) {
      std::string what = k == "quantize_base" ? "a QLoRA setting" : k == "use_dora" ? "a DoRA setting" : "a LoRA setting";
      return what + ", but `" + c.path + "` is a full-model builder: " +
             (recipe_.lora ? "use its lora_ builder" : "recipe " + recipe_.name + " trains all weights; use lora_finetune_" +
                                                           std::string(recipe_.distributed ? "distributed" : "single_device") +
                                                           " with a lora_ builder") +
             ", or remove it with ~" + key + "." + k;
    }
    if (c.kind == ComponentKind::Model && k == "apply_lora_to_output" && c.adapter != AdapterKind::None)
      return "`" + c.path + "` ties its output layer to the embeddings, so it has no separate output projection for LoRA";
    std::string hint = did_you_mean(key + "." + k, valid);
    if (hint.empty())
      hint = valid.empty() ? "; it takes no arguments" : "; it accepts " + join(valid);
    return "unknown key for " + c.path + hint;
  }

  const ComponentSpec* component_at(const char* key) const {
    const ConfigNode* n = tree_.find(key);
    if (n == nullptr || !n->is_map()) return nullptr;
    const ComponentSpec* c = find_component(n->component());
    return c != nullptr && c->unsupported.empty() ? c : nullptr;
  }

  void check_combinations() {
    const ConfigNode* model_node = tree_.find("model");
    const ComponentSpec* model = component_at("model");
    if (model != nullptr && model->kind == ComponentKind::Model) {
      if (!recipe_.lora && model->adapter != AdapterKind::None) {
        std::string base = model->path;
        std::size_t pos = base.rfind(model->adapter == AdapterKind::QLora ? ".qlora_" : ".lora_");
        if (pos != std::string::npos) base = base.substr(0, pos + 1) + base.substr(pos + (model->adapter == AdapterKind::QLora ? 7 : 6));
        add("model._component_", "`" + model->path + "` is a " +
                                     (model->adapter == AdapterKind::QLora ? "QLoRA" : "LoRA") + " builder, but recipe " +
                                     recipe_.name + " trains all weights: use `" + base + "`, or recipe lora_finetune_" +
                                     (recipe_.distributed ? "distributed" : "single_device"));
      }
      if (recipe_.lora && model->adapter == AdapterKind::None)
        add("model._component_", "`" + model->path + "` has no adapters, but recipe " + recipe_.name +
                                     " trains LoRA adapters: use its lora_ builder, or recipe full_finetune_" +
                                     (recipe_.distributed ? "distributed" : "single_device"));
      if (model_node && model->adapter != AdapterKind::None) {
        const ConfigNode* modules = model_node->find("lora_attn_modules");
        bool mlp = model_node->find("apply_lora_to_mlp") && model_node->find("apply_lora_to_mlp")->is_bool() &&
                   model_node->find("apply_lora_to_mlp")->as_bool();
        bool out = model_node->find("apply_lora_to_output") && model_node->find("apply_lora_to_output")->is_bool() &&
                   model_node->find("apply_lora_to_output")->as_bool();
        if (modules && modules->is_list() && modules->items().empty() && !mlp && !out)
          add("model.lora_attn_modules", "empty, and neither apply_lora_to_mlp nor apply_lora_to_output is set: "
                                         "LoRA would train nothing");
      }
      // The tokenizer and the checkpoint format must be this model family's.
      const ComponentSpec* tok = component_at("tokenizer");
      if (tok != nullptr && tok->kind == ComponentKind::Tokenizer) {
        std::vector<std::string> ok = tokenizer_families_for(model->family);
        if (std::find(ok.begin(), ok.end(), tok->tokenizer_family) == ok.end())
          add("tokenizer._component_", "`" + tok->path + "` is a " + tok->tokenizer_family + " tokenizer, but model `" +
                                           model->path + "` is " + model->family);
      }
      const ConfigNode* ckpt = tree_.find("checkpointer");
      const ConfigNode* type = ckpt && ckpt->is_map() ? ckpt->find("model_type") : nullptr;
      if (type && type->is_string() && component_at("checkpointer")) {
        std::vector<std::string> ok = model_types_for(model->family);
        if (std::find(ok.begin(), ok.end(), type->as_string()) == ok.end() &&
            std::find(model_types_for("hf").begin(), model_types_for("hf").end(), type->as_string()) !=
                model_types_for("hf").end())
          add("checkpointer.model_type", "`" + type->as_string() + "` does not match model `" + model->path +
                                             "` (" + model->family + "): expected " + join(ok));
      }
    }

    // Packing needs a fixed sequence length.
    const ConfigNode* tokenizer = tree_.find("tokenizer");
    if (const ConfigNode* pt = tokenizer && tokenizer->is_map() ? tokenizer->find("prompt_template") : nullptr) {
      try {
        prompt_template_from_config(*pt);
      } catch (const Error& e) {
        errors_.push_back(e);
      }
    }
    const ConfigNode* max_seq_len = tokenizer && tokenizer->is_map() ? tokenizer->find("max_seq_len") : nullptr;
    bool has_max_len = max_seq_len != nullptr && max_seq_len->is_int();
    for (const char* key : {"dataset", "dataset_val"}) {
      const ConfigNode* ds = tree_.find(key);
      if (ds == nullptr) continue;
      std::vector<std::pair<std::string, const ConfigNode*>> items;
      if (ds->is_list()) {
        for (std::size_t i = 0; i < ds->items().size(); ++i)
          items.emplace_back(std::string(key) + "." + std::to_string(i), &ds->items()[i]);
      } else {
        items.emplace_back(key, ds);
      }
      for (const auto& [path, d] : items) {
        if (!d->is_map()) continue;
        const ConfigNode* packed = d->find("packed");
        if (packed && packed->is_bool() && packed->as_bool() && !has_max_len)
          add(path + ".packed", "packing fills sequences to tokenizer.max_seq_len, which is not set: set "
                                "tokenizer.max_seq_len=N or " + path + ".packed=False");
        // A file format as source needs to be told where the files are.
        const ConfigNode* source = d->find("source");
        // HF datasets' other packaged builders (the SDK's DataFormat.XML writes source=xml): no reader here.
        static const std::vector<std::string> kUnread = {"xml", "pandas", "sql", "webdataset", "imagefolder",
                                                         "audiofolder", "videofolder", "pdffolder", "spark"};
        if (source && source->is_string() &&
            std::find(kUnread.begin(), kUnread.end(), source->as_string()) != kUnread.end())
          add(path + ".source", "ktune reads json, csv, parquet, arrow and text files; HF datasets' `" +
                                    source->as_string() + "` builder is not supported (convert the data, e.g. to JSON lines)");
        static const std::vector<std::string> kFormats = {"json", "csv", "parquet", "arrow", "text"};
        if (source && source->is_string() &&
            std::find(kFormats.begin(), kFormats.end(), source->as_string()) != kFormats.end()) {
          const ConfigNode* dir = d->find("data_dir");
          const ConfigNode* files = d->find("data_files");
          if ((dir == nullptr || dir->is_null()) && (files == nullptr || files->is_null()))
            add(path + ".source", "source `" + source->as_string() + "` is a file format: say where the files are "
                                  "with " + path + ".data_dir or " + path + ".data_files");
        }
      }
    }

    // optimizer_in_bwd steps inside the backward pass: no accumulation, no clipping (torchtune's rule).
    const ConfigNode* in_bwd = tree_.find("optimizer_in_bwd");
    if (!recipe_.lora && in_bwd && in_bwd->is_bool() && in_bwd->as_bool()) {
      const ConfigNode* ga = tree_.find("gradient_accumulation_steps");
      if (ga && ga->is_int() && ga->as_int() > 1)
        add("optimizer_in_bwd", "cannot be combined with gradient_accumulation_steps > 1 (the optimizer steps inside "
                                "the backward pass)");
      const ConfigNode* clip = tree_.find("clip_grad_norm");
      if (clip && !clip->is_null())
        add("optimizer_in_bwd", "cannot be combined with clip_grad_norm (gradients are never all present at once)");
    }

    // ktune's AdamW, on both engines, is torch.optim.AdamW's default update (kernels/cpu/adamw.h).
    const ConfigNode* optimizer = tree_.find("optimizer");
    const ConfigNode* amsgrad = optimizer && optimizer->is_map() ? optimizer->find("amsgrad") : nullptr;
    if (amsgrad && amsgrad->is_bool() && amsgrad->as_bool())
      add("optimizer.amsgrad", "ktune's AdamW is torch's default update, without amsgrad: set optimizer.amsgrad=False");

    const ConfigNode* profiler = tree_.find("profiler");
    const ConfigNode* enabled = profiler && profiler->is_map() ? profiler->find("enabled") : nullptr;
    const ConfigNode* active = profiler && profiler->is_map() ? profiler->find("active_steps") : nullptr;
    if (enabled && enabled->is_bool() && enabled->as_bool() && active && active->is_int() && active->as_int() < 1)
      add("profiler.active_steps", "must be at least 1 for the profiler to record a step");

    const ConfigNode* offload = tree_.find("enable_activation_offloading");
    const ConfigNode* ac = tree_.find("enable_activation_checkpointing");
    if (offload && offload->is_bool() && offload->as_bool() && !(ac && ac->is_bool() && ac->as_bool()))
      add("enable_activation_offloading", "offloads the activations that checkpointing keeps: it needs "
                                          "enable_activation_checkpointing=True");
  }

  const ConfigNode& tree_;
  const RecipeSpec& recipe_;
  std::vector<Error> errors_;
};

}  // namespace

std::vector<Error> check_config(const ConfigNode& tree, const RecipeSpec& recipe) {
  return Checker(tree, recipe).run();
}

void validate_config(const ConfigNode& tree, const RecipeSpec& recipe) {
  std::vector<Error> errors = check_config(tree, recipe);
  if (!errors.empty()) throw Errors(std::move(errors));
}

std::vector<std::string> recipe_top_level_keys(const RecipeSpec& recipe) {
  std::vector<std::string> out;
  for (const TopKey& k : top_keys())
    if (in_scope(k.scope, recipe)) out.push_back(k.name);
  for (const Slot& s : slots())
    if (in_scope(s.scope, recipe)) out.push_back(s.name);
  return out;
}

}  // namespace ktune::train
