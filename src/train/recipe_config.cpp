// Building the typed RecipeConfig from a validated tree. See recipe_config.h.
#include "train/recipe_config.h"

#include <cmath>
#include <cstdlib>

#include "core/error.h"
#include "train/config_interpolation.h"
#include "train/config_overrides.h"
#include "train/config_schema.h"
#include "train/config_suggest.h"

namespace ktune::train {

namespace {

// Readers for optional keys of a validated map: absent or null keeps the default.
const ConfigNode* get(const ConfigNode& map, const char* key) {
  const ConfigNode* n = map.is_map() ? map.find(key) : nullptr;
  return n != nullptr && !n->is_null() ? n : nullptr;
}
void read(const ConfigNode& m, const char* key, bool& out) {
  if (const ConfigNode* n = get(m, key)) out = n->as_bool();
}
void read(const ConfigNode& m, const char* key, int& out) {
  if (const ConfigNode* n = get(m, key)) out = static_cast<int>(n->as_int());
}
void read(const ConfigNode& m, const char* key, double& out) {
  if (const ConfigNode* n = get(m, key)) out = n->as_float();
}
void read(const ConfigNode& m, const char* key, std::string& out) {
  if (const ConfigNode* n = get(m, key)) out = n->as_string();
}
void read(const ConfigNode& m, const char* key, std::optional<bool>& out) {
  if (const ConfigNode* n = get(m, key)) out = n->as_bool();
}
void read(const ConfigNode& m, const char* key, std::optional<int>& out) {
  if (const ConfigNode* n = get(m, key)) out = static_cast<int>(n->as_int());
}
void read(const ConfigNode& m, const char* key, std::vector<std::string>& out) {
  const ConfigNode* n = get(m, key);
  if (n == nullptr) return;
  out.clear();
  if (n->is_string()) {
    out.push_back(n->as_string());
    return;
  }
  for (const ConfigNode& item : n->items()) out.push_back(item.as_string());
}

// {filename_format: model-{}-of-{}.safetensors, max_filename: "00030"} → model-00001-of-00030…
std::vector<std::string> expand_checkpoint_files(const ConfigNode& files) {
  std::vector<std::string> out;
  if (files.is_list()) {
    for (const ConfigNode& f : files.items()) out.push_back(f.as_string());
    return out;
  }
  std::string format = files.find("filename_format")->as_string();
  std::string max = files.find("max_filename")->as_string();
  long count = std::strtol(max.c_str(), nullptr, 10);
  for (long i = 1; i <= count; ++i) {
    std::string index = std::to_string(i);
    if (index.size() < max.size()) index = std::string(max.size() - index.size(), '0') + index;
    std::string name = format;
    std::size_t first = name.find("{}");
    name.replace(first, 2, index);
    std::size_t second = name.find("{}", first + index.size());
    name.replace(second, 2, max);
    out.push_back(name);
  }
  return out;
}

DatasetConfig make_dataset(const ConfigNode& d) {
  DatasetConfig ds;
  ds.component = d.component();
  const ComponentSpec* spec = find_component(ds.component);
  ds.style = spec->dataset_style;
  if (ds.component == "torchtune.datasets.alpaca_dataset") ds.source = "tatsu-lab/alpaca";
  if (ds.component == "torchtune.datasets.alpaca_cleaned_dataset") ds.source = "yahma/alpaca-cleaned";
  if (ds.style == "alpaca") ds.train_on_input = true;
  read(d, "source", ds.source);
  read(d, "data_dir", ds.data_dir);
  read(d, "data_files", ds.data_files);
  read(d, "name", ds.name);
  read(d, "split", ds.split);
  if (const ConfigNode* map = get(d, "column_map"))
    for (const auto& [k, v] : map->entries()) ds.column_map[k] = v.as_string();
  read(d, "train_on_input", ds.train_on_input);
  if (const ConfigNode* p = get(d, "new_system_prompt")) ds.new_system_prompt = p->as_string();
  read(d, "packed", ds.packed);
  read(d, "conversation_column", ds.conversation_column);
  read(d, "conversation_style", ds.conversation_style);
  read(d, "column", ds.column);
  read(d, "add_eos", ds.add_eos);
  read(d, "split_across_pack", ds.split_across_pack);
  return ds;
}

std::vector<DatasetConfig> make_datasets(const ConfigNode* node) {
  std::vector<DatasetConfig> out;
  if (node == nullptr || node->is_null()) return out;
  if (node->is_list()) {
    for (const ConfigNode& d : node->items()) out.push_back(make_dataset(d));
  } else {
    out.push_back(make_dataset(*node));
  }
  return out;
}

}  // namespace

RecipeConfig make_recipe_config(const ConfigNode& tree, const RecipeSpec& recipe, const std::string& config_name) {
  RecipeConfig c;
  c.recipe = recipe.name;
  c.config_name = config_name;
  c.tree = tree;
  read(tree, "output_dir", c.output_dir);

  const ConfigNode& m = *tree.find("model");
  const ComponentSpec* ms = find_component(m.component());
  c.model.component = ms->path;
  c.model.family = ms->family;
  c.model.size = ms->size;
  c.model.lora = ms->adapter != AdapterKind::None;
  c.model.quantize_base = ms->adapter == AdapterKind::QLora;
  read(m, "quantize_base", c.model.quantize_base);
  read(m, "use_dora", c.model.use_dora);
  read(m, "lora_attn_modules", c.model.lora_attn_modules);
  read(m, "apply_lora_to_mlp", c.model.apply_lora_to_mlp);
  read(m, "apply_lora_to_output", c.model.apply_lora_to_output);
  read(m, "lora_rank", c.model.lora_rank);
  read(m, "lora_alpha", c.model.lora_alpha);
  read(m, "lora_dropout", c.model.lora_dropout);
  if (const ConfigNode* tie = get(m, "tie_word_embeddings")) c.model.tie_word_embeddings = tie->as_bool();

  const ConfigNode& t = *tree.find("tokenizer");
  c.tokenizer.component = t.component();
  c.tokenizer.family = find_component(c.tokenizer.component)->tokenizer_family;
  read(t, "path", c.tokenizer.path);
  c.tokenizer.chat_template = c.tokenizer.component == kHuggingFaceModelTokenizer;
  read(t, "tokenizer_json_path", c.tokenizer.path);
  read(t, "tokenizer_config_json_path", c.tokenizer.tokenizer_config_path);
  read(t, "generation_config_path", c.tokenizer.generation_config_path);
  read(t, "truncation_type", c.tokenizer.truncation_type);
  read(t, "merges_file", c.tokenizer.merges_file);
  read(t, "special_tokens_path", c.tokenizer.special_tokens_path);
  read(t, "tokenizer_config_path", c.tokenizer.tokenizer_config_path);
  read(t, "max_seq_len", c.tokenizer.max_seq_len);
  if (const ConfigNode* pt = get(t, "prompt_template")) c.tokenizer.prompt_template = *pt;

  const ConfigNode& k = *tree.find("checkpointer");
  c.checkpointer.component = k.component();
  read(k, "checkpoint_dir", c.checkpointer.checkpoint_dir);
  c.checkpointer.checkpoint_files = expand_checkpoint_files(*k.find("checkpoint_files"));
  read(k, "model_type", c.checkpointer.model_type);
  read(k, "output_dir", c.checkpointer.output_dir);
  read(k, "adapter_checkpoint", c.checkpointer.adapter_checkpoint);
  read(k, "recipe_checkpoint", c.checkpointer.recipe_checkpoint);
  read(k, "safe_serialization", c.checkpointer.safe_serialization);

  c.datasets = make_datasets(tree.find("dataset"));
  c.datasets_val = make_datasets(tree.find("dataset_val"));

  const ConfigNode& o = *tree.find("optimizer");
  c.optimizer.component = o.component();
  read(o, "lr", c.optimizer.lr);
  if (const ConfigNode* betas = get(o, "betas"); betas && betas->is_list() && betas->items().size() == 2) {
    c.optimizer.beta1 = betas->items()[0].as_float();
    c.optimizer.beta2 = betas->items()[1].as_float();
  }
  read(o, "eps", c.optimizer.eps);
  read(o, "weight_decay", c.optimizer.weight_decay);
  read(o, "amsgrad", c.optimizer.amsgrad);
  read(o, "fused", c.optimizer.fused);

  if (const ConfigNode* s = get(tree, "lr_scheduler")) {
    c.lr_scheduler.component = s->component();
    read(*s, "num_warmup_steps", c.lr_scheduler.num_warmup_steps);
    read(*s, "num_cycles", c.lr_scheduler.num_cycles);
  }
  const ConfigNode& l = *tree.find("loss");
  c.loss.component = l.component();
  read(l, "num_output_chunks", c.loss.num_output_chunks);
  read(l, "ignore_index", c.loss.ignore_index);
  if (const ConfigNode* ml = get(tree, "metric_logger")) {
    c.metric_logger.component = ml->component();
    read(*ml, "log_dir", c.metric_logger.log_dir);
    read(*ml, "filename", c.metric_logger.filename);
    read(*ml, "organize_logs", c.metric_logger.organize_logs);
  }
  if (const ConfigNode* p = get(tree, "profiler")) {
    read(*p, "enabled", c.profiler.enabled);
    read(*p, "output_dir", c.profiler.output_dir);
    read(*p, "wait_steps", c.profiler.wait_steps);
    read(*p, "warmup_steps", c.profiler.warmup_steps);
    read(*p, "active_steps", c.profiler.active_steps);
    read(*p, "num_cycles", c.profiler.num_cycles);
    for (const char* key : {"profile_memory", "with_stack", "record_shapes", "with_flops"}) {
      bool on = false;
      read(*p, key, on);
      if (on) c.profiler.ignored.push_back(key);
    }
  }

  if (const ConfigNode* seed = get(tree, "seed")) c.seed = static_cast<std::uint64_t>(seed->as_int());
  read(tree, "shuffle", c.shuffle);
  read(tree, "batch_size", c.batch_size);
  read(tree, "epochs", c.epochs);
  read(tree, "max_steps_per_epoch", c.max_steps_per_epoch);
  read(tree, "gradient_accumulation_steps", c.gradient_accumulation_steps);
  if (const ConfigNode* clip = get(tree, "clip_grad_norm"))
    c.clip_grad_norm = clip->is_string() ? std::strtod(clip->as_string().c_str(), nullptr) : clip->as_float();
  read(tree, "compile", c.compile);
  read(tree, "log_every_n_steps", c.log_every_n_steps);
  read(tree, "log_peak_memory_stats", c.log_peak_memory_stats);
  read(tree, "device", c.device);
  std::string dtype = "bf16";
  read(tree, "dtype", dtype);
  c.dtype = dtype == "fp32" ? TrainDtype::FP32 : TrainDtype::BF16;
  read(tree, "enable_activation_checkpointing", c.enable_activation_checkpointing);
  read(tree, "enable_activation_offloading", c.enable_activation_offloading);
  read(tree, "resume_from_checkpoint", c.resume_from_checkpoint);
  read(tree, "save_every_n_steps", c.save_every_n_steps);
  read(tree, "optimizer_in_bwd", c.optimizer_in_bwd);
  read(tree, "save_adapter_weights_only", c.save_adapter_weights_only);
  read(tree, "low_cpu_ram", c.low_cpu_ram);
  read(tree, "fsdp_cpu_offload", c.fsdp_cpu_offload);
  read(tree, "fsdp_reshard_after_forward", c.fsdp_reshard_after_forward);
  read(tree, "custom_sharded_layers", c.custom_sharded_layers);
  read(tree, "run_val_every_n_steps", c.run_val_every_n_steps);
  return c;
}

ConfigNode prepare_config_tree(const RecipeSpec& recipe, const std::string& config_name_or_file,
                               const std::vector<std::string>& overrides, ConfigNode* unresolved) {
  ConfigSource source = find_config(config_name_or_file);
  ConfigNode tree = load_config_yaml(source.text, source.bundled ? source.name + ".yaml" : source.name);
  std::vector<Error> errors;
  try {
    apply_overrides(tree, overrides);
  } catch (const Errors& e) {
    errors.insert(errors.end(), e.errors().begin(), e.errors().end());
  }
  if (unresolved != nullptr) *unresolved = tree;
  try {
    resolve_interpolations(tree);
  } catch (const Errors& e) {
    errors.insert(errors.end(), e.errors().begin(), e.errors().end());
  }
  std::vector<Error> problems = check_config(tree, recipe);
  errors.insert(errors.end(), problems.begin(), problems.end());
  if (!errors.empty()) throw Errors(std::move(errors));
  return tree;
}

ktune::DatasetOptions dataset_options(const DatasetConfig& d) {
  DatasetOptions o;
  o.component = d.component;
  o.source = d.source;
  o.data_dir = d.data_dir;
  o.data_files = d.data_files;
  o.split = d.split;
  o.column_map = d.column_map;
  o.train_on_input = d.train_on_input;
  o.new_system_prompt = d.new_system_prompt;
  o.packed = d.packed;
  o.split_across_pack = d.split_across_pack;
  o.conversation_column = d.conversation_column;
  o.conversation_style = d.conversation_style;
  o.column = d.column;
  o.add_eos = d.add_eos;
  return o;
}

RecipeConfig prepare_recipe_config(const std::string& recipe_name, const std::string& config_name_or_file,
                                   const std::vector<std::string>& overrides) {
  const RecipeSpec* recipe = find_recipe(recipe_name);
  if (recipe == nullptr) {
    std::vector<std::string> names;
    for (const RecipeSpec& r : all_recipes()) names.push_back(r.name);
    throw Error("recipe " + recipe_name, "unknown recipe" + did_you_mean(recipe_name, names) +
                                             " (ktune's recipes: " + names[0] + ", " + names[1] + ", " + names[2] +
                                             ", " + names[3] + ")");
  }
  ConfigNode unresolved;
  ConfigNode tree = prepare_config_tree(*recipe, config_name_or_file, overrides, &unresolved);
  RecipeConfig config = make_recipe_config(tree, *recipe, config_name_or_file);
  config.unresolved_tree = std::move(unresolved);
  return config;
}

}  // namespace ktune::train
