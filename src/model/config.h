// ModelConfig: the architecture of a decoder, read from a Hugging Face config.json.
// Families: llama (3.x rope_scaling "llama3", tied embeddings), qwen2 (q/k/v bias), mistral
// (sliding window on every layer), gemma2 (sqrt(hidden) embedding scale, (1+w) norms, pre/post
// feed-forward norms, attention and final logit soft-capping, sliding window on the layers HF marks
// "sliding_attention", query_pre_attn_scalar, GELU-tanh). Both the transformers 4.x keys
// (rope_theta, rope_scaling) and the 5.x key (rope_parameters) are read.
// It deliberately refuses what it does not implement (other model types, activations, rope types,
// multimodal configs) with an Error naming the file and key, instead of guessing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cpu/rope.h"

namespace ktune::model {

enum class Family { Llama, Qwen2, Mistral, Gemma2 };
enum class Activation { SiLU, GeluTanh };  // of the gated MLP: act(gate) * up

struct ModelConfig {
  std::string model_type;  // as in config.json: "llama", "qwen2", "mistral", "gemma2"
  Family family = Family::Llama;
  int64_t vocab_size = 0, hidden_size = 0, intermediate_size = 0, num_layers = 0;
  int64_t num_heads = 0, num_kv_heads = 0, head_dim = 0;
  int64_t max_position_embeddings = 0;  // the longest sequence the model was made for; 0: config.json does not say
  float rms_norm_eps = 1e-6f;
  float rope_theta = 10000.0f;
  cpu::RopeScaling rope_scaling;  // type "" = none
  bool tie_word_embeddings = false;
  bool qkv_bias = false;   // bias on q, k, v projections (qwen2; llama's attention_bias)
  bool o_bias = false;     // bias on o_proj (llama's attention_bias)
  bool mlp_bias = false;   // bias on gate/up/down (llama's mlp_bias)
  Activation activation = Activation::SiLU;
  std::vector<int64_t> sliding_window;  // per layer, 0 = full causal attention
  float attn_logit_softcap = 0;        // 0 = off
  float final_logit_softcap = 0;       // 0 = off
  float attention_scale = 0;           // q.k multiplier: head_dim^-0.5, or query_pre_attn_scalar^-0.5
  float norm_weight_offset = 0;        // 1 for Gemma's x * (1 + w)
  bool sandwich_norms = false;         // Gemma2's post-attention and pre/post feed-forward norms
  bool scale_embeddings = false;       // Gemma: embeddings times sqrt(hidden_size) in the model dtype
  std::string torch_dtype;             // "float32", "bfloat16", ... as stored (informational)
  std::vector<int32_t> eos_token_ids;  // config.json's eos_token_id (an id or a list); empty when absent or null

  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }
  // Parameters in total (tied embeddings counted once).
  int64_t num_parameters() const;

  // where: the file name, for errors. Throws ktune::Error naming where and the key.
  static ModelConfig from_json_text(const std::string& text, const std::string& where);
  static ModelConfig from_file(const std::string& config_json_path);
  // A Llama-shaped config (for benchmarks and tests that need no checkpoint).
  static ModelConfig llama_like(int64_t vocab, int64_t hidden, int64_t layers, int64_t heads, int64_t kv_heads,
                                int64_t intermediate);
};

}  // namespace ktune::model
