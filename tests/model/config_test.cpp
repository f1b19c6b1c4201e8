// ModelConfig from HF config.json: each family's keys, both rope key styles, and clear errors.
#include "model/config.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "core/error.h"

using namespace ktune;
using namespace ktune::model;

namespace {

std::string fixture(const std::string& family) {
  return std::string(KTUNE_SOURCE_DIR) + "/tests/model/fixtures/" + family + "/config.json";
}

void expect_error(const std::string& json, const std::string& part) {
  try {
    ModelConfig::from_json_text(json, "config.json");
    FAIL() << "no error for " << json;
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("config.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find(part), std::string::npos) << "'" << part << "' not in: " << msg;
  }
}

TEST(ModelConfig, LlamaFixtureReadsRopeParametersAndTiedEmbeddings) {
  ModelConfig c = ModelConfig::from_file(fixture("llama"));
  EXPECT_EQ(c.family, Family::Llama);
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.num_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.rope_scaling.type, "llama3");
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 64);
  EXPECT_FLOAT_EQ(c.rope_theta, 500000.0f);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_FALSE(c.qkv_bias);
}

TEST(ModelConfig, Transformers4RopeKeysAreRead) {
  ModelConfig c = ModelConfig::from_json_text(R"({"model_type":"llama","vocab_size":10,"hidden_size":8,
    "intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2,"rope_theta":123.0,
    "rope_scaling":{"type":"llama3","factor":32.0,"low_freq_factor":1.0,"high_freq_factor":4.0,
    "original_max_position_embeddings":8192}})", "config.json");
  EXPECT_FLOAT_EQ(c.rope_theta, 123.0f);
  EXPECT_EQ(c.rope_scaling.type, "llama3");
  EXPECT_FLOAT_EQ(c.rope_scaling.factor, 32.0f);
  EXPECT_EQ(c.num_kv_heads, 2);  // defaults to the head count
  EXPECT_EQ(c.head_dim, 4);
}

TEST(ModelConfig, Qwen2HasQkvBiasOnly) {
  ModelConfig c = ModelConfig::from_file(fixture("qwen2"));
  EXPECT_EQ(c.family, Family::Qwen2);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.o_bias);
  EXPECT_FLOAT_EQ(c.rope_theta, 1e6f);
  for (int64_t w : c.sliding_window) EXPECT_EQ(w, 0);
}

TEST(ModelConfig, MistralSlidesOnEveryLayer) {
  ModelConfig c = ModelConfig::from_file(fixture("mistral"));
  ASSERT_EQ(c.sliding_window.size(), 2u);
  EXPECT_EQ(c.sliding_window[0], 6);
  EXPECT_EQ(c.sliding_window[1], 6);
}

TEST(ModelConfig, MistralWindowDefaultsLikeHf) {
  const std::string base = R"("model_type":"mistral","vocab_size":10,"hidden_size":8,"intermediate_size":16,
    "num_hidden_layers":2,"num_attention_heads":2)";
  EXPECT_EQ(ModelConfig::from_json_text("{" + base + "}", "config.json").sliding_window,
            (std::vector<int64_t>{4096, 4096}));  // MistralConfig's default
  EXPECT_EQ(ModelConfig::from_json_text("{" + base + R"(,"sliding_window":null})", "config.json").sliding_window,
            (std::vector<int64_t>{0, 0}));
}

TEST(ModelConfig, Gemma2AlternatesSlidingWindowAndSoftCaps) {
  ModelConfig c = ModelConfig::from_file(fixture("gemma2"));
  EXPECT_EQ(c.family, Family::Gemma2);
  EXPECT_EQ(c.head_dim, 24);  // from config, not hidden / heads
  ASSERT_EQ(c.sliding_window.size(), 3u);
  EXPECT_EQ(c.sliding_window[0], 5);
  EXPECT_EQ(c.sliding_window[1], 0);
  EXPECT_EQ(c.sliding_window[2], 5);
  EXPECT_FLOAT_EQ(c.attn_logit_softcap, 2.0f);
  EXPECT_FLOAT_EQ(c.final_logit_softcap, 3.0f);
  EXPECT_FLOAT_EQ(c.attention_scale, float(1.0 / std::sqrt(32.0)));
  EXPECT_EQ(c.activation, Activation::GeluTanh);
  EXPECT_FLOAT_EQ(c.norm_weight_offset, 1.0f);
  EXPECT_TRUE(c.sandwich_norms && c.scale_embeddings && c.tie_word_embeddings);
  // Without layer_types, HF slides on even layers.
  ModelConfig d = ModelConfig::from_json_text(R"({"model_type":"gemma2","vocab_size":10,"hidden_size":8,
    "intermediate_size":16,"num_hidden_layers":4,"num_attention_heads":2,"head_dim":4,"sliding_window":3})",
                                              "config.json");
  EXPECT_EQ(d.sliding_window, (std::vector<int64_t>{3, 0, 3, 0}));
  // Soft-capping keys absent: HF's Gemma2Config defaults (transformers: 50.0, 30.0); null: none.
  EXPECT_FLOAT_EQ(d.attn_logit_softcap, 50.0f);
  EXPECT_FLOAT_EQ(d.final_logit_softcap, 30.0f);
  ModelConfig uncapped = ModelConfig::from_json_text(R"({"model_type":"gemma2","vocab_size":10,"hidden_size":8,
    "intermediate_size":16,"num_hidden_layers":2,"num_attention_heads":2,"head_dim":4,
    "attn_logit_softcapping":null,"final_logit_softcapping":null})", "config.json");
  EXPECT_EQ(uncapped.attn_logit_softcap, 0.0f);
  EXPECT_EQ(uncapped.final_logit_softcap, 0.0f);
}

TEST(ModelConfig, ParameterCountMatchesTheFixtureFiles) {
  // llama fixture: tied, 2 layers, C=64, q=64, kv=32, I=96, V=160.
  ModelConfig c = ModelConfig::from_file(fixture("llama"));
  int64_t per_layer = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 96 + 2 * 64;
  EXPECT_EQ(c.num_parameters(), 160 * 64 + 2 * per_layer + 64);
}

TEST(ModelConfig, UnsupportedArchitectureNamesIt) {
  expect_error(R"({"model_type":"gpt2","vocab_size":10})", "'gpt2' is not supported");
}

TEST(ModelConfig, MissingKeysAreNamed) {
  expect_error(R"({"vocab_size":10})", "key model_type");
  expect_error(R"({"model_type":"llama","vocab_size":10,"intermediate_size":16,"num_hidden_layers":1,
    "num_attention_heads":2})", "key hidden_size");
}

TEST(ModelConfig, BadValuesAreNamed) {
  const std::string base = R"("vocab_size":10,"hidden_size":8,"intermediate_size":16,"num_hidden_layers":1)";
  expect_error(R"({"model_type":"llama",)" + base + R"(,"num_attention_heads":"two"})", "key num_attention_heads");
  expect_error(R"({"model_type":"llama",)" + base + R"(,"num_attention_heads":2,"num_key_value_heads":3})",
               "key num_key_value_heads");
  expect_error(R"({"model_type":"llama",)" + base + R"(,"num_attention_heads":2,"hidden_act":"relu"})",
               "activation 'relu'");
  expect_error(R"({"model_type":"llama",)" + base + R"(,"num_attention_heads":2,"rope_scaling":{"rope_type":"yarn"}})",
               "rope type 'yarn'");
  expect_error(R"({"model_type":"llama",)" + base + R"(,"num_attention_heads":2,"rope_scaling":{"rope_type":"llama3","factor":8}})",
               "low_freq_factor");
  expect_error("{not json", "not valid JSON");
  // Values no model has: named with their key before anything is sized by them.
  const std::string llama = R"({"model_type":"llama",)" + base + R"(,"num_attention_heads":2)";
  expect_error(llama + R"(,"rms_norm_eps":-1})", "key rms_norm_eps: must be a positive number, got -1");
  expect_error(llama + R"(,"rope_theta":0})", "key rope_theta: must be a positive number, got 0");
  expect_error(llama + R"(,"rope_parameters":{"rope_type":"default","rope_theta":-5.0}})",
               "key rope_parameters: key rope_theta: must be a positive number, got -5.0");
  expect_error(R"({"model_type":"llama","vocab_size":10,"hidden_size":8,"intermediate_size":16,
    "num_hidden_layers":1000000000000,"num_attention_heads":2})",
               "key num_hidden_layers: must be at most 4096, got 1000000000000");
  expect_error(llama + R"(,"eos_token_id":9999})", "key eos_token_id: must be a token id below vocab_size 10");
  expect_error(llama + R"(,"eos_token_id":[1,2,10]})", "key eos_token_id: must be a token id below vocab_size 10");
  expect_error(llama + R"(,"bos_token_id":"<s>"})", "key bos_token_id");
  expect_error(R"({"model_type":"llama","vocab_size":100000000000,"hidden_size":8,"intermediate_size":16,
    "num_hidden_layers":1,"num_attention_heads":2})",
               "key vocab_size: must be at most 67108864");
  // The eos ids a valid file names are kept, an id or a list alike.
  EXPECT_EQ(ModelConfig::from_json_text(llama + R"(,"eos_token_id":[1,9]})", "c").eos_token_ids, (std::vector<int32_t>{1, 9}));
  EXPECT_EQ(ModelConfig::from_json_text(llama + R"(,"eos_token_id":3})", "c").eos_token_ids, (std::vector<int32_t>{3}));
  EXPECT_TRUE(ModelConfig::from_json_text(llama + R"(,"eos_token_id":null})", "c").eos_token_ids.empty());
}

}  // namespace
