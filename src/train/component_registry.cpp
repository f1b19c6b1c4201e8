// The table of components ktune accepts by torchtune's dotted paths. See component_registry.h.
#include "train/component_registry.h"

#include <map>

namespace ktune::train {

const char* component_kind_name(ComponentKind kind) {
  switch (kind) {
    case ComponentKind::Model: return "model builder";
    case ComponentKind::Tokenizer: return "tokenizer";
    case ComponentKind::Dataset: return "dataset";
    case ComponentKind::Loss: return "loss";
    case ComponentKind::Checkpointer: return "checkpointer";
    case ComponentKind::Optimizer: return "optimizer";
    case ComponentKind::LrScheduler: return "learning-rate scheduler";
    case ComponentKind::MetricLogger: return "metric logger";
    case ComponentKind::Profiler: return "profiler";
  }
  return "?";
}

const char* param_type_name(ParamType type) {
  switch (type) {
    case ParamType::Bool: return "a bool";
    case ParamType::Int: return "an int";
    case ParamType::Float: return "a float";
    case ParamType::FloatLike: return "a float (or a string such as inf)";
    case ParamType::String: return "a string";
    case ParamType::StringList: return "a list of strings";
    case ParamType::StringOrList: return "a string or a list of strings";
    case ParamType::StringMap: return "a map of string to string";
    case ParamType::CheckpointFiles: return "a list of file names or {filename_format, max_filename}";
    case ParamType::FloatPair: return "a list of two floats";
    case ParamType::Any: return "any value";
  }
  return "?";
}

const ParamSpec* ComponentSpec::param(const std::string& name) const {
  for (const ParamSpec& p : params)
    if (p.name == name) return &p;
  return nullptr;
}

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

ParamSpec p_bool(std::string name) { return {std::move(name), ParamType::Bool}; }
ParamSpec p_int(std::string name, double min, bool nullable = false) {
  ParamSpec p{std::move(name), ParamType::Int};
  p.min = min;
  p.nullable = nullable;
  return p;
}
ParamSpec p_float(std::string name, double min, double max = kInf, bool max_exclusive = false) {
  ParamSpec p{std::move(name), ParamType::Float};
  p.min = min;
  p.max = max;
  p.max_exclusive = max_exclusive;
  return p;
}
ParamSpec p_str(std::string name, bool required = false, bool nullable = false) {
  ParamSpec p{std::move(name), ParamType::String};
  p.required = required;
  p.nullable = nullable;
  return p;
}
ParamSpec p_enum(std::string name, std::vector<std::string> allowed, bool required = false) {
  ParamSpec p{std::move(name), ParamType::String};
  p.allowed = std::move(allowed);
  p.required = required;
  return p;
}
ParamSpec with_nullable(ParamSpec p) {
  p.nullable = true;
  return p;
}

std::vector<ParamSpec> lora_params(bool has_output_lora) {
  ParamSpec modules{"lora_attn_modules", ParamType::StringList};
  modules.required = true;
  modules.allowed = {"q_proj", "k_proj", "v_proj", "output_proj"};
  std::vector<ParamSpec> params = {modules, p_bool("apply_lora_to_mlp")};
  if (has_output_lora) params.push_back(p_bool("apply_lora_to_output"));
  params.push_back(p_int("lora_rank", 1));
  params.push_back(p_float("lora_alpha", 0.0));
  params.push_back(p_float("lora_dropout", 0.0, 1.0, true));
  params.push_back(p_bool("use_dora"));
  params.push_back(p_bool("quantize_base"));
  return params;
}

struct FamilyRow {
  const char* module;        // torchtune.models.<module>
  const char* family;        // ktune's family name
  bool output_lora;          // the LoRA builder has apply_lora_to_output
  bool has_qlora;            // torchtune defines qlora_<name>
  bool tied_embeddings_arg;  // the builders take tie_word_embeddings (llama3_2)
  std::vector<std::pair<const char*, const char*>> sizes;  // builder suffix, size label
};

const std::vector<FamilyRow>& family_rows() {
  static const std::vector<FamilyRow> rows = {
      {"llama3_2", "llama3_2", true, true, true, {{"llama3_2_1b", "1B"}, {"llama3_2_3b", "3B"}}},
      {"llama3_1", "llama3_1", true, true, false,
       {{"llama3_1_8b", "8B"}, {"llama3_1_70b", "70B"}, {"llama3_1_405b", "405B"}}},
      {"llama3_3", "llama3_3", true, true, false, {{"llama3_3_70b", "70B"}}},
      {"llama3", "llama3", true, true, false, {{"llama3_8b", "8B"}, {"llama3_70b", "70B"}}},
      {"qwen2_5", "qwen2_5", true, false, false,
       {{"qwen2_5_0_5b", "0.5B"}, {"qwen2_5_1_5b_base", "1.5B-base"}, {"qwen2_5_1_5b_instruct", "1.5B"},
        {"qwen2_5_3b", "3B"}, {"qwen2_5_7b_base", "7B-base"}, {"qwen2_5_7b_instruct", "7B"},
        {"qwen2_5_14b_base", "14B-base"}, {"qwen2_5_14b_instruct", "14B"}, {"qwen2_5_32b_base", "32B-base"},
        {"qwen2_5_32b_instruct", "32B"}, {"qwen2_5_72b_base", "72B-base"}, {"qwen2_5_72b_instruct", "72B"}}},
      {"gemma2", "gemma2", false, true, false, {{"gemma2_2b", "2B"}, {"gemma2_9b", "9B"}, {"gemma2_27b", "27B"}}},
      {"mistral", "mistral", true, true, false, {{"mistral_7b", "7B"}}},
  };
  return rows;
}

void add_models(std::vector<ComponentSpec>& out) {
  for (const FamilyRow& row : family_rows()) {
    std::string prefix = std::string("torchtune.models.") + row.module + ".";
    for (const auto& [name, size] : row.sizes) {
      ComponentSpec full{prefix + name, ComponentKind::Model};
      full.family = row.family;
      full.size = size;
      if (row.tied_embeddings_arg) full.params.push_back(p_bool("tie_word_embeddings"));
      out.push_back(full);

      ComponentSpec lora = full;
      lora.path = prefix + "lora_" + name;
      lora.adapter = AdapterKind::Lora;
      lora.params = lora_params(row.output_lora);
      if (row.tied_embeddings_arg) lora.params.push_back(p_bool("tie_word_embeddings"));
      out.push_back(lora);

      if (row.has_qlora) {
        ComponentSpec qlora = lora;
        qlora.path = prefix + "qlora_" + name;
        qlora.adapter = AdapterKind::QLora;
        out.push_back(qlora);
      }
    }
  }
  // ktune's own builders: the architecture comes from checkpointer.checkpoint_dir/config.json
  // (any HF Llama/Qwen2/Gemma2/Mistral config), for models torchtune has no builder for, such as
  // the quickstart's tiny model.
  ComponentSpec hf{"ktune.models.hf_model", ComponentKind::Model};
  hf.family = "hf";
  hf.size = "from config.json";
  out.push_back(hf);
  ComponentSpec hf_lora = hf;
  hf_lora.path = "ktune.models.lora_hf_model";
  hf_lora.adapter = AdapterKind::Lora;
  hf_lora.params = lora_params(true);
  out.push_back(hf_lora);
  ComponentSpec hf_qlora = hf_lora;
  hf_qlora.path = "ktune.models.qlora_hf_model";
  hf_qlora.adapter = AdapterKind::QLora;
  out.push_back(hf_qlora);
}

void add_tokenizers(std::vector<ComponentSpec>& out) {
  ParamSpec template_param{"prompt_template", ParamType::Any};
  template_param.nullable = true;
  auto common = [&](std::vector<ParamSpec> extra) {
    std::vector<ParamSpec> params = {p_str("path", true)};
    params.insert(params.end(), extra.begin(), extra.end());
    params.push_back(p_int("max_seq_len", 1, true));
    params.push_back(template_param);
    return params;
  };
  ComponentSpec llama3{"torchtune.models.llama3.llama3_tokenizer", ComponentKind::Tokenizer,
                       common({p_str("special_tokens_path", false, true)})};
  llama3.tokenizer_family = "llama3";
  ComponentSpec qwen{"torchtune.models.qwen2_5.qwen2_5_tokenizer", ComponentKind::Tokenizer,
                     common({p_str("merges_file", true), p_str("special_tokens_path", false, true)})};
  qwen.tokenizer_family = "qwen2_5";
  ComponentSpec gemma{"torchtune.models.gemma.gemma_tokenizer", ComponentKind::Tokenizer, common({})};
  gemma.tokenizer_family = "gemma";
  ComponentSpec mistral{"torchtune.models.mistral.mistral_tokenizer", ComponentKind::Tokenizer, common({})};
  mistral.tokenizer_family = "mistral";
  // ktune's: an HF tokenizer.json (with tokenizer_config.json beside it for the chat template and
  // special tokens), for models without a torchtune tokenizer builder.
  ComponentSpec hf{"ktune.models.hf_tokenizer", ComponentKind::Tokenizer,
                   common({p_str("tokenizer_config_path", false, true)})};
  hf.tokenizer_family = "hf";
  // torchtune's (after 0.6.1) tokenizer for any HF model: tokenizer.json and the model's own Jinja chat
  // template (text/hf_chat_template.h). tokenizer_config.json beside the tokenizer.json by default.
  ComponentSpec hf_chat{kHuggingFaceModelTokenizer, ComponentKind::Tokenizer,
                        {p_str("tokenizer_json_path", true), p_str("tokenizer_config_json_path", false, true),
                         p_str("generation_config_path", false, true), p_int("max_seq_len", 1, true),
                         p_enum("truncation_type", {"right", "left"})}};
  hf_chat.tokenizer_family = "hf";
  out.insert(out.end(), {llama3, qwen, gemma, mistral, hf, hf_chat});
}

void add_datasets(std::vector<ComponentSpec>& out) {
  ParamSpec data_files{"data_files", ParamType::StringOrList};
  data_files.nullable = true;
  ParamSpec column_map{"column_map", ParamType::StringMap};
  column_map.nullable = true;
  std::vector<ParamSpec> location = {p_str("data_dir", false, true), data_files, p_str("name", false, true),
                                     p_str("split"), p_bool("packed")};
  auto make = [&](std::string path, std::string style, bool source_required, std::vector<ParamSpec> extra) {
    ComponentSpec c{std::move(path), ComponentKind::Dataset};
    c.dataset_style = std::move(style);
    c.params.push_back(p_str("source", source_required));
    c.params.insert(c.params.end(), extra.begin(), extra.end());
    c.params.insert(c.params.end(), location.begin(), location.end());
    return c;
  };
  out.push_back(make("torchtune.datasets.instruct_dataset", "instruct", true,
                     {column_map, p_bool("train_on_input"), p_str("new_system_prompt", false, true)}));
  out.push_back(make("torchtune.datasets.alpaca_dataset", "alpaca", false, {column_map, p_bool("train_on_input")}));
  out.push_back(
      make("torchtune.datasets.alpaca_cleaned_dataset", "alpaca", false, {column_map, p_bool("train_on_input")}));
  out.push_back(make("torchtune.datasets.chat_dataset", "chat", true,
                     {p_str("conversation_column", true), p_enum("conversation_style", {"sharegpt", "openai"}, true),
                      p_bool("train_on_input"), p_str("new_system_prompt", false, true)}));
  out.push_back(make("torchtune.datasets.text_completion_dataset", "text_completion", true,
                     {p_str("column"), p_bool("add_eos"), p_bool("split_across_pack")}));
}

void add_training_components(std::vector<ComponentSpec>& out) {
  std::vector<ParamSpec> loss_params = {p_int("num_output_chunks", 1), p_int("ignore_index", -kInf)};
  out.push_back({"torchtune.modules.loss.CEWithChunkedOutputLoss", ComponentKind::Loss, loss_params});
  out.push_back({"torchtune.modules.loss.LinearCrossEntropyLoss", ComponentKind::Loss, loss_params});

  ParamSpec files{"checkpoint_files", ParamType::CheckpointFiles};
  files.required = true;
  out.push_back({"torchtune.training.FullModelHFCheckpointer",
                 ComponentKind::Checkpointer,
                 {p_str("checkpoint_dir", true), files,
                  p_enum("model_type", {"LLAMA2", "LLAMA3", "LLAMA3_2", "QWEN2", "GEMMA", "GEMMA2", "MISTRAL"}, true),
                  p_str("output_dir", true), p_str("adapter_checkpoint", false, true),
                  p_str("recipe_checkpoint", false, true), p_bool("safe_serialization"),
                  p_bool("should_load_recipe_state")}});

  ParamSpec betas{"betas", ParamType::FloatPair};
  betas.min = 0.0;
  betas.max = 1.0;
  betas.max_exclusive = true;
  out.push_back({"torch.optim.AdamW",
                 ComponentKind::Optimizer,
                 {p_float("lr", 0.0), betas, p_float("eps", 0.0), p_float("weight_decay", 0.0), p_bool("amsgrad"),
                  p_bool("fused"), with_nullable(p_bool("foreach"))}});

  out.push_back({"torchtune.training.lr_schedulers.get_cosine_schedule_with_warmup",
                 ComponentKind::LrScheduler,
                 {p_int("num_warmup_steps", 0), p_float("num_cycles", 0.0)}});

  out.push_back({"torchtune.training.metric_logging.DiskLogger",
                 ComponentKind::MetricLogger,
                 {p_str("log_dir", true), p_str("filename", false, true)}});
  // torchtune's StdoutLogger takes (and ignores) any keyword, so configs that swap only _component_
  // keep their log_dir: ktune puts the JSON-lines twin there.
  out.push_back({"torchtune.training.metric_logging.StdoutLogger", ComponentKind::MetricLogger, {p_str("log_dir", false, true)}});
  out.push_back({"torchtune.training.metric_logging.TensorBoardLogger",
                 ComponentKind::MetricLogger,
                 {p_str("log_dir", true), p_bool("organize_logs")}});

  out.push_back({"torchtune.training.setup_torch_profiler",
                 ComponentKind::Profiler,
                 {p_bool("enabled"), p_str("output_dir"), p_bool("cpu"), p_bool("cuda"), p_bool("xpu"),
                  p_bool("profile_memory"), p_bool("with_stack"), p_bool("record_shapes"), p_bool("with_flops"),
                  p_int("wait_steps", 0), p_int("warmup_steps", 0), p_int("active_steps", 0),
                  p_int("num_cycles", 0)}});

  // torchtune components ktune knowingly does not implement.
  auto refuse = [&](std::string path, ComponentKind kind, std::string why) {
    ComponentSpec c{std::move(path), kind};
    c.unsupported = std::move(why);
    out.push_back(c);
  };
  const std::string bnb = "bitsandbytes optimizers are CUDA-only and not part of ktune; use torch.optim.AdamW "
                          "(with dtype=bf16 its state is bf16 too)";
  refuse("bitsandbytes.optim.PagedAdamW8bit", ComponentKind::Optimizer, bnb);
  refuse("bitsandbytes.optim.PagedAdamW", ComponentKind::Optimizer, bnb);
  refuse("torchao.optim.AdamW8bit", ComponentKind::Optimizer, "8-bit optimizers are not part of ktune; use torch.optim.AdamW");
  refuse("torch.optim.SGD", ComponentKind::Optimizer, "ktune implements AdamW only; use torch.optim.AdamW");
  refuse("torch.optim.Adam", ComponentKind::Optimizer,
         "ktune implements AdamW only; use torch.optim.AdamW with weight_decay: 0.0");
  refuse("torchtune.training.FullModelMetaCheckpointer", ComponentKind::Checkpointer,
         "ktune reads and writes Hugging Face checkpoints only; use torchtune.training.FullModelHFCheckpointer");
  refuse("torchtune.training.FullModelTorchTuneCheckpointer", ComponentKind::Checkpointer,
         "ktune reads and writes Hugging Face checkpoints only; use torchtune.training.FullModelHFCheckpointer");
  refuse("torchtune.training.metric_logging.WandBLogger", ComponentKind::MetricLogger,
         "Weights & Biases needs the network; use torchtune.training.metric_logging.DiskLogger");
  refuse("torchtune.training.metric_logging.MLFlowLogger", ComponentKind::MetricLogger,
         "MLflow needs a tracking server; use torchtune.training.metric_logging.DiskLogger");
  refuse("torchtune.training.metric_logging.CometLogger", ComponentKind::MetricLogger,
         "Comet needs the network; use torchtune.training.metric_logging.DiskLogger");
  refuse("torchtune.modules.loss.ForwardKLWithChunkedOutputLoss", ComponentKind::Loss,
         "knowledge distillation is not a ktune recipe");
  // torchtune's named datasets: each is a general builder with its columns fixed and a Hub source;
  // with the data fetched (the dataset initializer, `ktune download`), the general one reads it.
  const std::string fetched = "ktune has no builder of that name; with the data fetched (ktune download), ";
  refuse("torchtune.datasets.samsum_dataset", ComponentKind::Dataset,
         fetched + "torchtune.datasets.instruct_dataset with source: <folder>, column_map: {input: dialogue, output: "
                   "summary} and tokenizer.prompt_template: torchtune.data.SummarizeTemplate makes its samples");
  refuse("torchtune.datasets.grammar_dataset", ComponentKind::Dataset,
         fetched + "torchtune.datasets.instruct_dataset with source: <folder> and tokenizer.prompt_template: "
                   "torchtune.data.GrammarErrorCorrectionTemplate makes its samples");
  refuse("torchtune.datasets.slimorca_dataset", ComponentKind::Dataset,
         fetched + "torchtune.datasets.chat_dataset with source: <folder>, conversation_column: conversations and "
                   "conversation_style: sharegpt makes its samples");
  refuse("torchtune.datasets.wikitext_dataset", ComponentKind::Dataset,
         fetched + "torchtune.datasets.text_completion_dataset with source: <folder> and column: page makes its samples");
  refuse("torchtune.datasets.cnn_dailymail_articles_dataset", ComponentKind::Dataset,
         fetched + "torchtune.datasets.text_completion_dataset with source: <folder> and column: article makes its samples");
  for (const char* preference : {"torchtune.datasets.preference_dataset", "torchtune.datasets.stack_exchange_paired_dataset",
                                 "torchtune.datasets.hh_rlhf_helpful_dataset"})
    refuse(preference, ComponentKind::Dataset, "preference pairs train DPO/PPO recipes, which ktune does not have");
}

std::vector<ComponentSpec> build_registry() {
  std::vector<ComponentSpec> out;
  add_models(out);
  add_tokenizers(out);
  add_datasets(out);
  add_training_components(out);
  return out;
}

}  // namespace

const std::vector<ComponentSpec>& all_components() {
  static const std::vector<ComponentSpec> registry = build_registry();
  return registry;
}

const ComponentSpec* find_component(const std::string& path) {
  static const std::map<std::string, const ComponentSpec*> index = [] {
    std::map<std::string, const ComponentSpec*> m;
    for (const ComponentSpec& c : all_components()) m[c.path] = &c;
    return m;
  }();
  auto it = index.find(path);
  return it == index.end() ? nullptr : it->second;
}

std::vector<std::string> component_paths(ComponentKind kind) {
  std::vector<std::string> out;
  for (const ComponentSpec& c : all_components())
    if (c.kind == kind && c.unsupported.empty()) out.push_back(c.path);
  return out;
}

std::vector<std::string> tokenizer_families_for(const std::string& family) {
  if (family == "hf") return {"hf", "llama3", "qwen2_5", "gemma", "mistral"};
  if (family == "llama3_2" || family == "llama3_1" || family == "llama3_3" || family == "llama3")
    return {"llama3", "hf"};
  if (family == "qwen2_5") return {"qwen2_5", "hf"};
  if (family == "gemma2") return {"gemma", "hf"};
  if (family == "mistral") return {"mistral", "hf"};
  return {};
}

std::vector<std::string> model_types_for(const std::string& family) {
  if (family == "llama3_2") return {"LLAMA3_2"};
  if (family == "llama3_1" || family == "llama3_3" || family == "llama3") return {"LLAMA3"};
  if (family == "qwen2_5") return {"QWEN2"};
  if (family == "gemma2") return {"GEMMA2"};
  if (family == "mistral") return {"MISTRAL"};
  return {"LLAMA2", "LLAMA3", "LLAMA3_2", "QWEN2", "GEMMA", "GEMMA2", "MISTRAL"};
}

}  // namespace ktune::train
