// The components a config may name, by torchtune's dotted paths, and what ktune implements for
// each: `torchtune.models.llama3_2.lora_llama3_2_1b` is the Llama 3.2 1B decoder with LoRA
// adapters; `torch.optim.AdamW` is ktune's AdamW; and so on. Each entry lists the keyword
// arguments the component accepts (name, type, range, allowed values), which is what validation
// checks a config section against. A few torchtune components that ktune knowingly does not
// implement are listed with the reason, so the error can say so instead of "unknown".
// It holds no behaviour: the recipes build the real objects from the typed config.
#pragma once

#include <limits>
#include <string>
#include <vector>

namespace ktune::train {

enum class ComponentKind { Model, Tokenizer, Dataset, Loss, Checkpointer, Optimizer, LrScheduler, MetricLogger, Profiler };
const char* component_kind_name(ComponentKind kind);  // "model builder", "tokenizer", …

enum class ParamType {
  Bool,
  Int,
  Float,          // an int is accepted too
  FloatLike,      // a float, an int, or a string Python's float() reads ("inf")
  String,
  StringList,
  StringOrList,   // a string or a list of strings (data_files)
  StringMap,      // a map of string to string (column_map)
  CheckpointFiles,// a list of file names, or {filename_format, max_filename}
  FloatPair,      // a list of two floats (AdamW's betas), each within min/max
  Any,            // any YAML value (prompt_template)
};
const char* param_type_name(ParamType type);  // "a bool", "an int", … for messages

struct ParamSpec {
  std::string name;
  ParamType type = ParamType::String;
  bool nullable = false;
  bool required = false;
  double min = -std::numeric_limits<double>::infinity();  // numbers: inclusive bounds
  double max = std::numeric_limits<double>::infinity();
  bool max_exclusive = false;
  std::vector<std::string> allowed;  // strings and string lists: the allowed values
};

enum class AdapterKind { None, Lora, QLora };

struct ComponentSpec {
  std::string path;  // "torchtune.models.llama3_2.lora_llama3_2_1b"
  ComponentKind kind = ComponentKind::Model;
  std::vector<ParamSpec> params;
  std::string unsupported;  // non-empty: torchtune has it, ktune refuses it, and why

  // Model builders: the architecture family ("llama3_2", "qwen2_5", "gemma2", "mistral",
  // "llama3_1", "llama3_3", "llama3", or "hf" = read from checkpoint_dir/config.json), the size
  // ("1B", "0.5B", "7B-instruct"), and the adapter the builder puts on it.
  std::string family;
  std::string size;
  AdapterKind adapter = AdapterKind::None;
  // Tokenizers: the tokenizer family ("llama3", "qwen2_5", "gemma", "mistral", "hf").
  std::string tokenizer_family;
  // Datasets: "instruct", "alpaca", "chat", "text_completion".
  std::string dataset_style;

  const ParamSpec* param(const std::string& name) const;
};

// torchtune's tokenizer for any HF model that formats conversations with the model's own chat
// template (text/hf_chat_template.h).
inline constexpr const char* kHuggingFaceModelTokenizer = "torchtune.modules.transforms.tokenizers.HuggingFaceModelTokenizer";

// The entry for a dotted path, or nullptr.
const ComponentSpec* find_component(const std::string& path);
// Every registered path of one kind (supported ones only), in registry order.
std::vector<std::string> component_paths(ComponentKind kind);
const std::vector<ComponentSpec>& all_components();

// The tokenizer families a model family can use, and the checkpointer model_type values it
// can be saved as (torchtune's ModelType names).
std::vector<std::string> tokenizer_families_for(const std::string& model_family);
std::vector<std::string> model_types_for(const std::string& model_family);

}  // namespace ktune::train
