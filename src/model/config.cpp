// Reading HF config.json into ModelConfig. See config.h.
#include "model/config.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace ktune::model {

using nlohmann::json;

namespace {

struct Reader {
  const json& j;
  std::string where;

  std::string at(const std::string& key) const { return where + ": key " + key; }
  bool has(const std::string& key) const { return j.contains(key) && !j[key].is_null(); }

  // A size of the model: positive, and at most kMaxSize (2^26: larger than any vocabulary, width
  // or context of a model this trains; a bigger value is a corrupt file, not a model to allocate).
  static constexpr int64_t kMaxSize = int64_t(1) << 26;
  int64_t integer(const std::string& key, int64_t max = kMaxSize) const {
    if (!has(key)) throw Error(at(key), "missing (required for " + j.value("model_type", std::string("?")) + ")");
    return integer_value(key, max);
  }
  int64_t integer_or(const std::string& key, int64_t fallback, int64_t max = kMaxSize) const {
    return has(key) ? integer_value(key, max) : fallback;
  }
  int64_t integer_value(const std::string& key, int64_t max) const {
    const json& v = j[key];
    if (!v.is_number_integer()) throw Error(at(key), "must be an integer, got " + v.dump());
    int64_t x = v.get<int64_t>();
    if (x <= 0) throw Error(at(key), "must be positive, got " + std::to_string(x));
    if (x > max) throw Error(at(key), "must be at most " + std::to_string(max) + ", got " + std::to_string(x));
    return x;
  }
  double number(const std::string& key, double fallback) const {
    if (!has(key)) return fallback;
    if (!j[key].is_number()) throw Error(at(key), "must be a number, got " + j[key].dump());
    return j[key].get<double>();
  }
  // A scale, an epsilon, a base: a finite number above 0.
  double positive_number(const std::string& key, double fallback) const {
    const double x = number(key, fallback);
    if (!(x > 0) || !std::isfinite(x))
      throw Error(at(key), "must be a positive number, got " + (has(key) ? j[key].dump() : std::to_string(x)));
    return x;
  }
  bool boolean(const std::string& key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!j[key].is_boolean()) throw Error(at(key), "must be true or false, got " + j[key].dump());
    return j[key].get<bool>();
  }
  std::string string(const std::string& key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    if (!j[key].is_string()) throw Error(at(key), "must be a string, got " + j[key].dump());
    return j[key].get<std::string>();
  }
};

void read_rope(const Reader& r, ModelConfig& c) {
  // transformers 5.x: rope_parameters {rope_type, rope_theta, factor, ...};
  // 4.x: rope_theta and rope_scaling {rope_type | type, factor, ...}.
  const json* scaling = nullptr;
  std::string scaling_key;
  c.rope_theta = float(r.positive_number("rope_theta", c.rope_theta));
  if (r.has("rope_parameters")) {
    scaling_key = "rope_parameters";
    scaling = &r.j["rope_parameters"];
    if (!scaling->is_object()) throw Error(r.at(scaling_key), "must be an object");
    if (scaling->contains("rope_theta"))
      c.rope_theta = float(Reader{*scaling, r.where + ": key rope_parameters"}.positive_number("rope_theta", 0.0));
  } else if (r.has("rope_scaling")) {
    scaling_key = "rope_scaling";
    scaling = &r.j["rope_scaling"];
    if (!scaling->is_object()) throw Error(r.at(scaling_key), "must be an object");
  }
  if (!scaling) return;
  Reader s{*scaling, r.where + ": key " + scaling_key};
  std::string type = s.string("rope_type", s.string("type", ""));
  if (type == "default" || type.empty()) return;
  if (type != "llama3" && type != "linear")
    throw Error(r.at(scaling_key + ".rope_type"), "rope type '" + type + "' is not supported (default, linear, llama3 are)");
  c.rope_scaling.type = type;
  c.rope_scaling.factor = float(s.positive_number("factor", 1.0));
  if (type == "llama3") {
    for (const char* k : {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"})
      if (!s.has(k)) throw Error(r.at(scaling_key + "." + k), "missing (required for llama3 rope scaling)");
    c.rope_scaling.low_freq_factor = float(s.number("low_freq_factor", 1.0));
    c.rope_scaling.high_freq_factor = float(s.number("high_freq_factor", 4.0));
    c.rope_scaling.original_max_position_embeddings = s.integer("original_max_position_embeddings");
  }
}

std::vector<int64_t> read_layer_types(const Reader& r, int64_t layers, int64_t window) {
  const json& lt = r.j["layer_types"];
  if (!lt.is_array() || int64_t(lt.size()) != layers)
    throw Error(r.at("layer_types"), "must be a list of " + std::to_string(layers) + " layer types");
  std::vector<int64_t> out;
  for (const json& t : lt) {
    std::string s = t.is_string() ? t.get<std::string>() : "";
    if (s == "full_attention") out.push_back(0);
    else if (s == "sliding_attention") {
      if (window <= 0) throw Error(r.at("sliding_window"), "needed by a sliding_attention layer");
      out.push_back(window);
    } else {
      throw Error(r.at("layer_types"), "unknown layer type " + t.dump());
    }
  }
  return out;
}

}  // namespace

int64_t ModelConfig::num_parameters() const {
  int64_t C = hidden_size;
  int64_t per_layer = C * q_dim() + 2 * C * kv_dim() + q_dim() * C + 3 * C * intermediate_size;
  if (qkv_bias) per_layer += q_dim() + 2 * kv_dim();
  if (o_bias) per_layer += C;
  if (mlp_bias) per_layer += 2 * intermediate_size + C;
  per_layer += (sandwich_norms ? 4 : 2) * C;
  int64_t total = vocab_size * C + num_layers * per_layer + C;
  if (!tie_word_embeddings) total += vocab_size * C;
  return total;
}

ModelConfig ModelConfig::from_json_text(const std::string& text, const std::string& where) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(where, std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw Error(where, "not a JSON object");
  Reader r{j, where};
  ModelConfig c;
  if (!r.has("model_type")) throw Error(r.at("model_type"), "missing");
  c.model_type = r.string("model_type", "");
  if (c.model_type == "llama") c.family = Family::Llama;
  else if (c.model_type == "qwen2") c.family = Family::Qwen2;
  else if (c.model_type == "mistral") c.family = Family::Mistral;
  else if (c.model_type == "gemma2") c.family = Family::Gemma2;
  else
    throw Error(r.at("model_type"), "architecture '" + c.model_type +
                                        "' is not supported (llama, qwen2, mistral, gemma2 are)");

  c.vocab_size = r.integer("vocab_size");
  // The ids generation starts and stops with (HF: an id or a list of ids) are ids of the vocabulary.
  for (const char* key : {"bos_token_id", "eos_token_id"}) {
    if (!r.has(key)) continue;
    const json& v = r.j[key];
    const json ids = v.is_array() ? v : json::array({v});
    for (const json& id : ids)
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= c.vocab_size)
        throw Error(r.at(key), "must be a token id below vocab_size " + std::to_string(c.vocab_size) + " (or a list of them), got " +
                                   v.dump());
    if (std::string(key) == "eos_token_id")
      for (const json& id : ids) c.eos_token_ids.push_back(int32_t(id.get<int64_t>()));
  }
  c.hidden_size = r.integer("hidden_size");
  c.intermediate_size = r.integer("intermediate_size");
  c.num_layers = r.integer("num_hidden_layers", 4096);  // no model has more; a larger count is a corrupt file
  c.num_heads = r.integer("num_attention_heads");
  c.num_kv_heads = r.integer_or("num_key_value_heads", c.num_heads);
  if (c.num_heads % c.num_kv_heads != 0)
    throw Error(r.at("num_key_value_heads"), std::to_string(c.num_kv_heads) + " does not divide num_attention_heads " +
                                                 std::to_string(c.num_heads));
  if (r.has("head_dim")) {
    c.head_dim = r.integer("head_dim");
  } else {
    if (c.hidden_size % c.num_heads != 0)
      throw Error(r.at("num_attention_heads"), "does not divide hidden_size and no head_dim is given");
    c.head_dim = c.hidden_size / c.num_heads;
  }
  if (c.head_dim % 2 != 0) throw Error(r.at("head_dim"), "must be even for rotary embeddings");
  c.max_position_embeddings = r.integer_or("max_position_embeddings", 0);
  c.rms_norm_eps = float(r.positive_number("rms_norm_eps", 1e-6));
  c.torch_dtype = r.string("torch_dtype", r.string("dtype", "float32"));
  read_rope(r, c);
  c.attention_scale = float(1.0 / std::sqrt(double(c.head_dim)));
  c.sliding_window.assign(size_t(c.num_layers), 0);

  for (const char* k : {"vision_config", "text_config"})
    if (r.has(k)) throw Error(r.at(k), "multimodal configs are not supported");

  std::string act_key = c.family == Family::Gemma2 && r.has("hidden_activation") ? "hidden_activation" : "hidden_act";
  std::string act = r.string(act_key, c.family == Family::Gemma2 ? "gelu_pytorch_tanh" : "silu");
  if (act == "silu" || act == "swish") c.activation = Activation::SiLU;
  else if (act == "gelu_pytorch_tanh" || act == "gelu_tanh") c.activation = Activation::GeluTanh;
  else throw Error(r.at(act_key), "activation '" + act + "' is not supported (silu, gelu_pytorch_tanh are)");

  switch (c.family) {
    case Family::Llama: {
      bool attention_bias = r.boolean("attention_bias", false);
      c.qkv_bias = c.o_bias = attention_bias;
      c.mlp_bias = r.boolean("mlp_bias", false);
      c.tie_word_embeddings = r.boolean("tie_word_embeddings", false);
      break;
    }
    case Family::Qwen2: {
      c.qkv_bias = true;
      c.tie_word_embeddings = r.boolean("tie_word_embeddings", false);
      int64_t window = r.boolean("use_sliding_window", false) ? r.integer_or("sliding_window", 0) : 0;
      if (r.has("layer_types")) {
        c.sliding_window = read_layer_types(r, c.num_layers, window);
      } else if (window > 0) {
        int64_t first = r.integer_or("max_window_layers", c.num_layers);
        for (int64_t l = first; l < c.num_layers; ++l) c.sliding_window[size_t(l)] = window;
      }
      break;
    }
    case Family::Mistral: {
      c.tie_word_embeddings = r.boolean("tie_word_embeddings", false);
      if (r.has("layer_types"))
        throw Error(r.at("layer_types"), "mistral with per-layer attention types (Ministral) is not supported");
      // Absent means HF's class default (4096); null means full attention.
      int64_t window = !r.j.contains("sliding_window") ? 4096 : r.integer_or("sliding_window", 0);
      c.sliding_window.assign(size_t(c.num_layers), window);
      break;
    }
    case Family::Gemma2: {
      c.tie_word_embeddings = r.boolean("tie_word_embeddings", true);
      c.norm_weight_offset = 1.0f;
      c.sandwich_norms = true;
      c.scale_embeddings = true;
      c.qkv_bias = c.o_bias = r.boolean("attention_bias", false);
      // Absent means HF's class defaults (50 and 30); null means no capping.
      c.attn_logit_softcap = !r.j.contains("attn_logit_softcapping") ? 50.0f : float(r.number("attn_logit_softcapping", 0.0));
      c.final_logit_softcap = !r.j.contains("final_logit_softcapping") ? 30.0f : float(r.number("final_logit_softcapping", 0.0));
      double qpas = r.number("query_pre_attn_scalar", 256.0);
      if (qpas <= 0) throw Error(r.at("query_pre_attn_scalar"), "must be positive");
      c.attention_scale = float(std::pow(qpas, -0.5));
      // Absent means HF's class default (4096); null means full attention.
      int64_t window = !r.j.contains("sliding_window") ? 4096 : r.integer_or("sliding_window", 0);
      if (r.has("layer_types")) {
        c.sliding_window = read_layer_types(r, c.num_layers, window);
      } else if (window > 0) {  // HF's default: even layers (0, 2, ...) slide
        for (int64_t l = 0; l < c.num_layers; l += 2) c.sliding_window[size_t(l)] = window;
      }
      break;
    }
  }
  return c;
}

ModelConfig ModelConfig::from_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(path, "cannot open the model config");
  std::stringstream ss;
  ss << in.rdbuf();
  return from_json_text(ss.str(), path);
}

ModelConfig ModelConfig::llama_like(int64_t vocab, int64_t hidden, int64_t layers, int64_t heads, int64_t kv_heads,
                                    int64_t intermediate) {
  json j = {{"model_type", "llama"},        {"vocab_size", vocab},          {"hidden_size", hidden},
            {"num_hidden_layers", layers},  {"num_attention_heads", heads}, {"num_key_value_heads", kv_heads},
            {"intermediate_size", intermediate}, {"rms_norm_eps", 1e-5},    {"rope_theta", 500000.0},
            {"max_position_embeddings", 8192}};
  return from_json_text(j.dump(), "llama_like");
}

}  // namespace ktune::model
