#include "train/known_models.h"

#include <map>

#include "core/error.h"

namespace ktune::train {
namespace {

// The config.json text of each known model, and the Hugging Face names that mean it.
struct KnownModels {
  std::map<std::string, std::string> configs;
  std::map<std::string, std::string> aliases;
};

const KnownModels& known_models() {
  // HF config.json values of the public checkpoints (the fields that size the model).
  static const KnownModels models{{
      {"llama3_3/70B",
       R"({"model_type":"llama","vocab_size":128256,"hidden_size":8192,"intermediate_size":28672,"num_hidden_layers":80,
           "num_attention_heads":64,"num_key_value_heads":8,"rms_norm_eps":1e-5,"rope_theta":500000.0,
           "max_position_embeddings":131072,"tie_word_embeddings":false})"},
      {"llama3_1/8B",
       R"({"model_type":"llama","vocab_size":128256,"hidden_size":4096,"intermediate_size":14336,"num_hidden_layers":32,
           "num_attention_heads":32,"num_key_value_heads":8,"rms_norm_eps":1e-5,"rope_theta":500000.0,
           "max_position_embeddings":131072,"tie_word_embeddings":false})"},
      {"llama3_2/1B",
       R"({"model_type":"llama","vocab_size":128256,"hidden_size":2048,"intermediate_size":8192,"num_hidden_layers":16,
           "num_attention_heads":32,"num_key_value_heads":8,"head_dim":64,"rms_norm_eps":1e-5,"rope_theta":500000.0,
           "max_position_embeddings":131072,"tie_word_embeddings":true})"},
      {"llama3_2/3B",
       R"({"model_type":"llama","vocab_size":128256,"hidden_size":3072,"intermediate_size":8192,"num_hidden_layers":28,
           "num_attention_heads":24,"num_key_value_heads":8,"head_dim":128,"rms_norm_eps":1e-5,"rope_theta":500000.0,
           "max_position_embeddings":131072,"tie_word_embeddings":true})"},
      {"llama3_1/70B",  // Llama 3.3 70B's shape
       R"({"model_type":"llama","vocab_size":128256,"hidden_size":8192,"intermediate_size":28672,"num_hidden_layers":80,
           "num_attention_heads":64,"num_key_value_heads":8,"rms_norm_eps":1e-5,"rope_theta":500000.0,
           "max_position_embeddings":131072,"tie_word_embeddings":false})"},
      {"qwen2_5/0.5B",
       R"({"model_type":"qwen2","vocab_size":151936,"hidden_size":896,"intermediate_size":4864,"num_hidden_layers":24,
           "num_attention_heads":14,"num_key_value_heads":2,"rms_norm_eps":1e-6,"rope_theta":1000000.0,
           "max_position_embeddings":32768,"tie_word_embeddings":true})"},
      {"qwen2_5/1.5B",
       R"({"model_type":"qwen2","vocab_size":151936,"hidden_size":1536,"intermediate_size":8960,"num_hidden_layers":28,
           "num_attention_heads":12,"num_key_value_heads":2,"rms_norm_eps":1e-6,"rope_theta":1000000.0,
           "max_position_embeddings":32768,"tie_word_embeddings":true})"},
      {"qwen2_5/3B",
       R"({"model_type":"qwen2","vocab_size":151936,"hidden_size":2048,"intermediate_size":11008,"num_hidden_layers":36,
           "num_attention_heads":16,"num_key_value_heads":2,"rms_norm_eps":1e-6,"rope_theta":1000000.0,
           "max_position_embeddings":32768,"tie_word_embeddings":true})"},
      {"qwen2_5/7B",
       R"({"model_type":"qwen2","vocab_size":152064,"hidden_size":3584,"intermediate_size":18944,"num_hidden_layers":28,
           "num_attention_heads":28,"num_key_value_heads":4,"rms_norm_eps":1e-6,"rope_theta":1000000.0,
           "max_position_embeddings":32768,"tie_word_embeddings":false})"},
      {"mistral/7B",
       R"({"model_type":"mistral","vocab_size":32000,"hidden_size":4096,"intermediate_size":14336,"num_hidden_layers":32,
           "num_attention_heads":32,"num_key_value_heads":8,"rms_norm_eps":1e-5,"rope_theta":10000.0,
           "sliding_window":4096,"max_position_embeddings":32768,"tie_word_embeddings":false})"},
      {"gemma2/2B",
       R"({"model_type":"gemma2","vocab_size":256000,"hidden_size":2304,"intermediate_size":9216,"num_hidden_layers":26,
           "num_attention_heads":8,"num_key_value_heads":4,"head_dim":256,"query_pre_attn_scalar":256,
           "rms_norm_eps":1e-6,"rope_theta":10000.0,"sliding_window":4096,"attn_logit_softcapping":50.0,
           "final_logit_softcapping":30.0,"hidden_activation":"gelu_pytorch_tanh","max_position_embeddings":8192,
           "tie_word_embeddings":true})"},
      {"gemma2/9B",
       R"({"model_type":"gemma2","vocab_size":256000,"hidden_size":3584,"intermediate_size":14336,"num_hidden_layers":42,
           "num_attention_heads":16,"num_key_value_heads":8,"head_dim":256,"query_pre_attn_scalar":224,
           "rms_norm_eps":1e-6,"rope_theta":10000.0,"sliding_window":4096,"attn_logit_softcapping":50.0,
           "final_logit_softcapping":30.0,"hidden_activation":"gelu_pytorch_tanh","max_position_embeddings":8192,
           "tie_word_embeddings":true})"},
      {"gemma2/27B",
       R"({"model_type":"gemma2","vocab_size":256000,"hidden_size":4608,"intermediate_size":36864,"num_hidden_layers":46,
           "num_attention_heads":32,"num_key_value_heads":16,"head_dim":128,"query_pre_attn_scalar":144,
           "rms_norm_eps":1e-6,"rope_theta":10000.0,"sliding_window":4096,"attn_logit_softcapping":50.0,
           "final_logit_softcapping":30.0,"hidden_activation":"gelu_pytorch_tanh","max_position_embeddings":8192,
           "tie_word_embeddings":true})"}},
      // The Hugging Face repositories the runtimes (manifests/make_runtimes.py) fetch, and the meta-llama names.
      {
      {"meta-llama/Llama-3.3-70B-Instruct", "llama3_3/70B"}, {"meta-llama/Llama-3.1-8B-Instruct", "llama3_1/8B"},
      {"meta-llama/Llama-3.1-8B", "llama3_1/8B"},            {"meta-llama/Llama-3.2-1B-Instruct", "llama3_2/1B"},
      {"meta-llama/Llama-3.2-1B", "llama3_2/1B"},            {"meta-llama/Llama-3.2-3B-Instruct", "llama3_2/3B"},
      {"meta-llama/Llama-3.2-3B", "llama3_2/3B"},            {"meta-llama/Llama-3.1-70B-Instruct", "llama3_1/70B"},
      {"Qwen/Qwen2.5-0.5B-Instruct", "qwen2_5/0.5B"},        {"Qwen/Qwen2.5-1.5B-Instruct", "qwen2_5/1.5B"},
      {"Qwen/Qwen2.5-3B-Instruct", "qwen2_5/3B"},            {"Qwen/Qwen2.5-7B-Instruct", "qwen2_5/7B"},
      {"mistralai/Mistral-7B-v0.1", "mistral/7B"},           {"google/gemma-2-2b", "gemma2/2B"},
      {"google/gemma-2-9b", "gemma2/9B"},                    {"google/gemma-2-27b", "gemma2/27B"}}};
  return models;
}

// The known model a size-specific builder builds: its family and size as the component registry
// spells them (torchtune's llama3 builders are Llama 3.1's shape; Qwen2.5's base and instruct
// checkpoints share theirs).
std::string builder_model_name(const std::string& family, std::string size) {
  if (const size_t base = size.find("-base"); base != std::string::npos) size.erase(base);
  return (family == "llama3" ? std::string("llama3_1") : family) + "/" + size;
}

std::string shape_of(const model::ModelConfig& c) {
  return c.model_type + ", hidden_size " + std::to_string(c.hidden_size) + ", intermediate_size " +
         std::to_string(c.intermediate_size) + ", " + std::to_string(c.num_layers) + " layers, " +
         std::to_string(c.num_heads) + " heads (" + std::to_string(c.num_kv_heads) + " key/value), vocab_size " +
         std::to_string(c.vocab_size);
}

bool same_shape(const model::ModelConfig& a, const model::ModelConfig& b) {
  return a.model_type == b.model_type && a.hidden_size == b.hidden_size && a.intermediate_size == b.intermediate_size &&
         a.num_layers == b.num_layers && a.num_heads == b.num_heads && a.num_kv_heads == b.num_kv_heads &&
         a.head_dim == b.head_dim && a.vocab_size == b.vocab_size;
}

}  // namespace

std::optional<model::ModelConfig> known_model(const std::string& name) {
  const KnownModels& known = known_models();
  std::string key = name;
  if (auto a = known.aliases.find(name); a != known.aliases.end()) key = a->second;
  auto k = known.configs.find(key);
  if (k == known.configs.end()) return std::nullopt;
  return model::ModelConfig::from_json_text(k->second, "known model " + key);
}

std::vector<std::string> known_model_names() {
  std::vector<std::string> names;
  for (const auto& [name, config] : known_models().configs) names.push_back(name);
  return names;
}

void check_builder_matches_checkpoint(const std::string& component, const std::string& family,
                                      const std::string& size, const model::ModelConfig& checkpoint,
                                      const std::string& config_path) {
  const std::string name = builder_model_name(family, size);
  const std::optional<model::ModelConfig> built = known_model(name);
  if (!built || same_shape(*built, checkpoint)) return;
  throw Error("model._component_ " + component,
              "builds " + name + " (" + shape_of(*built) + "), but " + config_path + " describes another model (" +
                  shape_of(checkpoint) + "): use that model's config, or ktune.models.hf_model / lora_hf_model / "
                  "qlora_hf_model, which build what config.json describes");
}

}  // namespace ktune::train
