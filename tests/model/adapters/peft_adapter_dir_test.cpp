// PEFT adapter directories (model/adapters/peft_adapter_dir.h) against PEFT itself: the directories
// PEFT's save_pretrained wrote (tests/model/fixtures/make_peft_adapter_fixtures.py: LoRA on part of
// the MLP, rsLoRA + DoRA, LoRA on an untied lm_head with the base weight PEFT saves beside it) put
// on the base give the logits PeftModel.from_pretrained gives; what cannot be loaded is refused
// naming the file and the key or tensor.
#include "model/adapters/peft_adapter_dir.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/safetensors.h"

namespace ktune::model {
namespace {

namespace fs = std::filesystem;
const std::string kSource = KTUNE_SOURCE_DIR;
const std::string kPeft = kSource + "/tests/model/fixtures/peft/";

std::string base_of(const std::string& adapter_dir) {
  std::ifstream in(adapter_dir + "/adapter_config.json");
  return kSource + "/" + nlohmann::json::parse(in).at("base_model_name_or_path").get<std::string>();
}

// max |ktune - reference| over the logits of the fixture's tokens, and the reference's largest |value|.
std::pair<float, float> logits_error(Decoder& decoder, const std::string& adapter_dir, const char* reference_name) {
  io::SafetensorsFile reference = io::SafetensorsFile::open(adapter_dir + "/reference.safetensors");
  EXPECT_EQ(reference.info("tokens").dtype, "I64");
  const auto* tokens64 = static_cast<const int64_t*>(reference.address("tokens"));
  std::vector<int32_t> tokens(tokens64, tokens64 + reference.info("tokens").shape.numel());
  Batch batch{tokens.data(), nullptr, nullptr, nullptr, 1, int64_t(tokens.size())};
  Tensor logits = decoder.forward_logits(batch);
  Tensor expected = reference.to_f32(reference_name);
  EXPECT_EQ(logits.numel(), expected.numel());
  float error = 0, scale = 0;
  for (int64_t i = 0; i < expected.numel(); ++i) {
    error = std::max(error, std::fabs(logits.f32()[i] - expected.f32()[i]));
    scale = std::max(scale, std::fabs(expected.f32()[i]));
  }
  return {error, scale};
}

class PeftAdapterDir : public ::testing::TestWithParam<const char*> {};

TEST_P(PeftAdapterDir, GivesPeftsLogitsOverTheBase) {
  const std::string dir = kPeft + GetParam();
  auto decoder = Decoder::from_pretrained(base_of(dir));
  // Before: the base's logits (the reference's base_logits), far from PEFT's.
  auto [base_error, base_scale] = logits_error(*decoder, dir, "base_logits");
  EXPECT_LT(base_error, 1e-4f * base_scale);
  EXPECT_GT(logits_error(*decoder, dir, "logits").first, 1e-2f);
  auto adapters = load_peft_adapter(*decoder, dir);
  EXPECT_FALSE(adapters.empty());
  auto [error, scale] = logits_error(*decoder, dir, "logits");
  EXPECT_LT(error, 1e-4f * scale) << "max |ktune - PEFT| " << error << " of " << scale;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PeftAdapterDir, ::testing::Values("lora", "rslora_dora", "lora_head"));

TEST(PeftAdapterDirConfig, ReadsRankAlphaAndTheVariants) {
  PeftAdapterConfig c = read_peft_adapter_config(kPeft + "rslora_dora");
  EXPECT_EQ(c.options.rank, 4);
  EXPECT_EQ(c.options.alpha, 6.0f);
  EXPECT_TRUE(c.options.use_dora);
  EXPECT_TRUE(c.options.use_rslora);
  EXPECT_EQ(c.options.dropout, 0.0f);
  EXPECT_EQ(c.target_modules, (std::vector<std::string>{"k_proj", "up_proj"}));
}

// A copy of the lora fixture with its config edited, or its weights rewritten, to see each refusal.
class PeftAdapterDirRefusal : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ktune_peft_refusal_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    for (const char* f : {"adapter_config.json", "adapter_model.safetensors"}) fs::copy_file(kPeft + "lora/" + f, dir_ / f);
    std::ifstream in(dir_ / "adapter_config.json");
    config_ = nlohmann::json::parse(in);
  }
  void TearDown() override { fs::remove_all(dir_); }
  // The message of the error loading the edited copy onto the tied base throws.
  std::string refusal(const nlohmann::json& config) {
    std::ofstream(dir_ / "adapter_config.json") << config.dump(2);
    auto decoder = Decoder::from_pretrained(kSource + "/tests/model/fixtures/llama");
    try {
      load_peft_adapter(*decoder, dir_.string());
    } catch (const Error& e) {
      return e.what();
    }
    return "(loaded)";
  }
  fs::path dir_;
  nlohmann::json config_;
};

TEST_F(PeftAdapterDirRefusal, NamesTheKeyItCannotHonour) {
  auto edited = [&](const char* key, nlohmann::json value) {
    nlohmann::json c = config_;
    c[key] = std::move(value);
    return refusal(c);
  };
  EXPECT_NE(edited("peft_type", "IA3").find("peft_type"), std::string::npos);
  EXPECT_NE(edited("target_modules", "all-linear").find("PEFT's shorthand"), std::string::npos);
  EXPECT_NE(edited("target_modules", {"q_proj", "c_attn"}).find("'c_attn' matches no projection"), std::string::npos);
  EXPECT_NE(edited("target_modules", {"q_proj", "lm_head"}).find("ties its output layer"), std::string::npos);
  EXPECT_NE(edited("rank_pattern", {{"q_proj", 8}}).find("rank_pattern"), std::string::npos);
  EXPECT_NE(edited("bias", "all").find("bias"), std::string::npos);
  EXPECT_NE(edited("fan_in_fan_out", true).find("fan_in_fan_out"), std::string::npos);
  EXPECT_NE(edited("lora_bias", true).find("lora_bias"), std::string::npos);
  EXPECT_NE(edited("layers_to_transform", {0}).find("layers_to_transform"), std::string::npos);
  EXPECT_NE(edited("r", 0).find(": r"), std::string::npos);
  // A rank the tensors do not have: the tensor is named with both shapes.
  const std::string wrong_rank = edited("r", 8);
  EXPECT_NE(wrong_rank.find("lora_A.weight is (4, 64)"), std::string::npos) << wrong_rank;
  // Fewer targets than the file holds adapters for: the unused tensor is named.
  const std::string fewer = edited("target_modules", {"q_proj", "v_proj", "o_proj", "gate_proj"});
  EXPECT_NE(fewer.find("down_proj.lora_A.weight, which no targeted projection"), std::string::npos) << fewer;
  // More: the missing tensor is named.
  const std::string more = edited("target_modules", {"q_proj", "v_proj", "o_proj", "gate_proj", "down_proj", "k_proj"});
  EXPECT_NE(more.find("has no tensor base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight"), std::string::npos)
      << more;
  // And the unedited copy loads.
  EXPECT_EQ(refusal(config_), "(loaded)");
  // The same modules named as PEFT may name them (its rule: the whole name, or a dotted suffix of
  // it; a string is a regular expression over the whole name): full paths, as PEFT saves
  // "all-linear", partial paths, and a regex all load; a regex that matches nothing is refused.
  nlohmann::json full = nlohmann::json::array(), partial = nlohmann::json::array();
  std::set<std::string> kinds;
  const io::SafetensorsFile weights = io::SafetensorsFile::open((dir_ / "adapter_model.safetensors").string());
  for (const std::string& name : weights.names()) {
    const std::string prefix = "base_model.model.", tail = ".lora_A.weight";
    if (name.size() < tail.size() || name.compare(name.size() - tail.size(), tail.size(), tail) != 0) continue;
    const std::string module = name.substr(prefix.size(), name.size() - prefix.size() - tail.size());
    full.push_back(module);
    const std::string two = module.substr(module.rfind('.', module.rfind('.') - 1) + 1);  // self_attn.q_proj
    if (kinds.insert(two).second) partial.push_back(two);
  }
  ASSERT_GT(full.size(), partial.size());
  EXPECT_EQ(edited("target_modules", full), "(loaded)");
  EXPECT_EQ(edited("target_modules", partial), "(loaded)");
  std::string alternatives;
  for (const auto& k : kinds) alternatives += (alternatives.empty() ? "" : "|") + k.substr(k.find('.') + 1);
  EXPECT_EQ(edited("target_modules", "model\\.layers\\.\\d+\\..*\\.(" + alternatives + ")"), "(loaded)");
  EXPECT_NE(edited("target_modules", ".*\\.c_attn").find("'.*\\.c_attn' matches no projection"), std::string::npos);
  EXPECT_NE(edited("target_modules", {"layers.0.self_attn.q_proj.x"}).find("matches no projection"), std::string::npos);
  fs::remove(dir_ / "adapter_model.safetensors");
  EXPECT_NE(refusal(config_).find("adapter_model.safetensors"), std::string::npos);
}

}  // namespace
}  // namespace ktune::model
