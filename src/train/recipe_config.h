// The typed view of a validated config that the recipes read: every key torchtune's four
// recipes use, with torchtune's defaults for the ones a config leaves out, and the component
// each section names resolved to what ktune implements (model family and size, adapter kind,
// tokenizer family, dataset style). `prepare_recipe_config` is the whole front half of
// `ktune run`: find the config, apply the overrides, resolve ${…}, validate, and type it,
// reporting every problem of all four steps together.
// It does not load anything the config points at (files, tokenizers, weights).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "data/dataset_builders.h"
#include "train/component_registry.h"
#include "train/config.h"
#include "train/recipe_registry.h"

namespace ktune::train {

enum class TrainDtype { BF16, FP32 };

struct ModelConfig {
  std::string component;       // torchtune.models.llama3_2.lora_llama3_2_1b
  std::string family;          // llama3_2, llama3_1, llama3_3, llama3, qwen2_5, gemma2, mistral, hf
  std::string size;            // 1B, 0.5B, 7B, 1.5B-base, "from config.json"
  bool lora = false;           // has adapters (LoRA, DoRA or QLoRA)
  bool quantize_base = false;  // NF4 base weights (qlora_ builder, or quantize_base: True)
  bool use_dora = false;
  std::vector<std::string> lora_attn_modules;  // subset of q_proj, k_proj, v_proj, output_proj
  bool apply_lora_to_mlp = false;
  bool apply_lora_to_output = false;
  int lora_rank = 8;
  double lora_alpha = 16.0;
  double lora_dropout = 0.0;
  std::optional<bool> tie_word_embeddings;  // llama3_2 builders only
};

struct TokenizerConfig {
  std::string component;
  std::string family;  // llama3, qwen2_5, gemma, mistral, hf
  std::string path;
  std::string merges_file;          // qwen2_5
  std::string special_tokens_path;  // "" when unset
  std::string tokenizer_config_path;  // ktune.models.hf_tokenizer, HuggingFaceModelTokenizer
  std::optional<int> max_seq_len;
  ConfigNode prompt_template;       // null when unset (the tokenizer's default)
  // HuggingFaceModelTokenizer: conversations through the model's own chat template.
  bool chat_template = false;
  std::string generation_config_path;  // its EOS when tokenizer_config.json names none
  std::string truncation_type = "right";
};

struct CheckpointerConfig {
  std::string component;
  std::string checkpoint_dir;
  std::vector<std::string> checkpoint_files;  // {filename_format, max_filename} expanded
  std::string model_type;
  std::string output_dir;
  std::string adapter_checkpoint;  // "" when unset
  std::string recipe_checkpoint;   // "" when unset
  bool safe_serialization = true;
};

struct DatasetConfig {
  std::string component;
  std::string style;  // instruct, alpaca, chat, text_completion
  std::string source;  // a format (json, csv, parquet, arrow, text), a local path, or a Hub name
  std::string data_dir;
  std::vector<std::string> data_files;
  std::string name;
  std::string split = "train";
  std::map<std::string, std::string> column_map;
  bool train_on_input = false;
  std::optional<std::string> new_system_prompt;
  bool packed = false;
  std::string conversation_column;  // chat
  std::string conversation_style;   // chat: sharegpt | openai
  std::string column = "text";      // text_completion
  bool add_eos = true;              // text_completion
  std::optional<bool> split_across_pack;  // text_completion's (default true); the others' packs never split a sample
};

struct OptimizerConfig {
  std::string component = "torch.optim.AdamW";
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
  bool amsgrad = false;
  bool fused = false;
};

struct LrSchedulerConfig {
  std::string component;  // "" when the config has none (a constant learning rate)
  int num_warmup_steps = 0;
  double num_cycles = 0.5;
};

struct LossConfig {
  std::string component;  // CEWithChunkedOutputLoss or LinearCrossEntropyLoss
  int num_output_chunks = 8;
  int ignore_index = -100;
};

struct MetricLoggerConfig {
  std::string component;  // "" when none
  std::string log_dir;
  std::string filename;       // DiskLogger: "" → log_<unix time>.txt
  bool organize_logs = true;  // TensorBoardLogger: a run_0_<time> folder under log_dir
};

struct RecipeConfig {
  std::string recipe;       // the recipe name
  std::string config_name;  // the bundled name or the file
  ConfigNode tree;          // the resolved tree the fields below come from
  // The tree before its interpolations were resolved (overrides applied): what torchtune's
  // save_config writes to output_dir/torchtune_config.yaml. Null where the config was made from a
  // resolved tree alone (make_recipe_config).
  ConfigNode unresolved_tree;

  std::string output_dir;
  ModelConfig model;
  TokenizerConfig tokenizer;
  CheckpointerConfig checkpointer;
  std::vector<DatasetConfig> datasets;  // one, or several concatenated
  std::vector<DatasetConfig> datasets_val;
  OptimizerConfig optimizer;
  LrSchedulerConfig lr_scheduler;
  LossConfig loss;
  MetricLoggerConfig metric_logger;

  std::optional<std::uint64_t> seed;
  bool shuffle = true;
  int batch_size = 1;
  int epochs = 1;
  std::optional<int> max_steps_per_epoch;
  int gradient_accumulation_steps = 1;
  std::optional<double> clip_grad_norm;  // +inf: log the norm, clip nothing
  bool compile = false;
  int log_every_n_steps = 1;
  bool log_peak_memory_stats = false;
  std::string device = "cuda";
  TrainDtype dtype = TrainDtype::BF16;
  bool enable_activation_checkpointing = false;
  bool enable_activation_offloading = false;
  bool resume_from_checkpoint = false;
  std::optional<int> save_every_n_steps;
  bool optimizer_in_bwd = false;
  bool save_adapter_weights_only = false;
  bool low_cpu_ram = false;
  bool fsdp_cpu_offload = false;
  bool fsdp_reshard_after_forward = true;
  std::vector<std::string> custom_sharded_layers;
  std::optional<int> run_val_every_n_steps;
  // profiler (torchtune.training.setup_torch_profiler; train/profiler.h): unset schedule keys take
  // torchtune's defaults; the torch-only switches are kept to be said ignored.
  struct Profiler {
    bool enabled = false;
    std::string output_dir;  // "" = <output_dir>/profiling_outputs
    std::optional<int> wait_steps, warmup_steps, active_steps, num_cycles;
    std::vector<std::string> ignored;  // profile_memory, with_stack, record_shapes, with_flops set True
  } profiler;
};

// Types a tree that validate_config() accepted for `recipe`.
RecipeConfig make_recipe_config(const ConfigNode& tree, const RecipeSpec& recipe, const std::string& config_name);

// find_config + load + apply_overrides + resolve_interpolations + validate_config +
// make_recipe_config. Throws ktune::Errors holding every problem found along the way.
RecipeConfig prepare_recipe_config(const std::string& recipe_name, const std::string& config_name_or_file,
                                   const std::vector<std::string>& overrides);

// A dataset entry as the data layer's builders take it (split_across_pack left unset unless the
// config sets it: the builder's default then applies, as torchtune's builders set theirs).
ktune::DatasetOptions dataset_options(const DatasetConfig& dataset);

// The same steps without the typing, for `ktune validate` and `ktune cat`: the resolved tree.
// unresolved (when given) receives the tree before interpolation.
ConfigNode prepare_config_tree(const RecipeSpec& recipe, const std::string& config_name_or_file,
                               const std::vector<std::string>& overrides, ConfigNode* unresolved = nullptr);

}  // namespace ktune::train
