// The recipe and config table, row by row (upstream-compat.md), the model key rule, and ktune's
// copy of torchtune's config set against the fixture made from torchtune's own registry.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "runtime/recipe_table.h"

namespace ktune {
namespace {

TEST(ModelKey, DerivedFromRuntimeNameWithExactlyThreeFields) {
  const std::vector<std::pair<std::string, std::string>> rows{
      {"torchtune-llama3.2-1b", "llama3_2/1B"},   {"torchtune-llama3.2-3b", "llama3_2/3B"},
      {"torchtune-llama3.1-8b", "llama3_1/8B"},   {"torchtune-llama3.1-70b", "llama3_1/70B"},
      {"torchtune-llama3.3-70b", "llama3_3/70B"}, {"torchtune-qwen2.5-0.5b", "qwen2_5/0.5B"},
      {"torchtune-qwen2.5-1.5b", "qwen2_5/1.5B"}, {"torchtune-qwen2.5-7b", "qwen2_5/7B"},
      {"torchtune-gemma2-27b", "gemma2/27B"},     {"torchtune-mistral-7b", "mistral/7B"},
      {"torch-distributed", ""},                  {"torchtune-llama3.2-1b-lora", ""},
      {"torchtune", ""},                          {"", ""}};
  for (const auto& [name, key] : rows) EXPECT_EQ(model_key_from_runtime_name(name), key) << name;
}

struct Row {
  const char* what;
  int nodes, procs;
  std::vector<std::string> args;
  const char* recipe;
  const char* config;
};

TEST(RecipeTable, EveryRowFirstMatchWins) {
  const std::vector<std::string> lora{"model.lora_rank=8", "model.lora_attn_modules=[q_proj,v_proj]"};
  const std::vector<std::string> qlora{"model.quantize_base=True", "model.lora_attn_modules=[q_proj,v_proj]"};
  const std::vector<Row> rows{
      {"1 node, 1 process, QLoRA", 1, 1, qlora, "lora_finetune_single_device", "llama3_2/1B_qlora_single_device"},
      {"1 node, 1 process, LoRA", 1, 1, lora, "lora_finetune_single_device", "llama3_2/1B_lora_single_device"},
      {"1 node, 1 process", 1, 1, {"epochs=1"}, "full_finetune_single_device", "llama3_2/1B_full_single_device"},
      {"1 node, QLoRA", 1, 4, qlora, "lora_finetune_distributed", "llama3_2/1B_qlora"},
      {"1 node, LoRA", 1, 4, lora, "lora_finetune_distributed", "llama3_2/1B_lora"},
      {">1 node", 2, 8, {}, "full_finetune_distributed", "llama3_2/1B_full_multinode"},
      {">1 node, LoRA args (rejected by validation)", 2, 1, lora, "full_finetune_distributed", "llama3_2/1B_full_multinode"},
      {"otherwise", 1, 2, {}, "full_finetune_distributed", "llama3_2/1B_full"},
      {"QLoRA without LoRA modules still QLoRA", 1, 1, {"model.quantize_base=True"}, "lora_finetune_single_device",
       "llama3_2/1B_qlora_single_device"},
      {"DoRA = LoRA configs", 1, 1, {"model.quantize_base=True", "model.use_dora=True", "model.lora_attn_modules=[q_proj]"},
       "lora_finetune_single_device", "llama3_2/1B_lora_single_device"},
      {"quantize_base=False is not QLoRA", 1, 1, {"model.quantize_base=False", "model.lora_attn_modules=[q_proj]"},
       "lora_finetune_single_device", "llama3_2/1B_lora_single_device"},
      {"use_dora=False keeps QLoRA", 1, 1, {"model.quantize_base=True", "model.use_dora=False"},
       "lora_finetune_single_device", "llama3_2/1B_qlora_single_device"},
      {"a value mentioning the key is not LoRA", 1, 1, {"dataset.new_system_prompt=model.lora_attn_modules"},
       "full_finetune_single_device", "llama3_2/1B_full_single_device"},
  };
  for (const Row& r : rows) {
    const RecipeChoice c = select_recipe("llama3_2/1B", r.nodes, r.procs, r.args);
    EXPECT_EQ(c.recipe, r.recipe) << r.what;
    EXPECT_EQ(c.config, r.config) << r.what;
  }
}

TEST(RecipeTable, MistralSingleDeviceFullFineTuneUsesTheLowMemoryConfig) {
  const RecipeChoice c = select_recipe("mistral/7B", 1, 1, {});
  EXPECT_EQ(c.recipe, "full_finetune_single_device");
  EXPECT_EQ(c.config, "mistral/7B_full_low_memory");
  EXPECT_TRUE(torchtune_config_exists(c.config));
  // Where the real name exists, no alias.
  EXPECT_EQ(select_recipe("qwen2_5/7B", 1, 1, {}).config, "qwen2_5/7B_full_single_device");
  const ConfigSet both({"mistral/7B_full_low_memory", "mistral/7B_full_single_device"}, "test");
  EXPECT_EQ(select_recipe("mistral/7B", 1, 1, {}, both).config, "mistral/7B_full_single_device");
  EXPECT_TRUE(both.contains("mistral/7B_full_single_device"));
  EXPECT_FALSE(both.contains("mistral/7B"));
  EXPECT_EQ(both.for_model("mistral/7B").size(), 2u);
}

TEST(TorchTuneConfigs, MatchTorchtunesOwnRecipeRegistry) {
  std::ifstream in(std::string(KTUNE_SOURCE_DIR) + "/tests/runtime/fixtures/torchtune_configs.json");
  ASSERT_TRUE(in) << "fixture missing: run tests/runtime/fixtures/make_torchtune_configs.py";
  const nlohmann::json fixture = nlohmann::json::parse(in);
  std::vector<std::string> models;
  for (auto it = fixture["models"].begin(); it != fixture["models"].end(); ++it) {
    models.push_back(it.key());
    std::vector<std::pair<std::string, std::string>> want, got;
    for (const auto& row : it.value()) want.emplace_back(row[0], row[1]);
    for (const TorchTuneConfigEntry& e : torchtune_configs(it.key())) got.emplace_back(e.config, e.recipe);
    std::sort(got.begin(), got.end());
    EXPECT_EQ(got, want) << it.key();
  }
  auto ours = supported_models();
  std::sort(ours.begin(), ours.end());
  std::sort(models.begin(), models.end());
  EXPECT_EQ(ours, models);
  EXPECT_EQ(ours.size(), 13u);
}

TEST(TorchTuneConfigs, OnlyLlama33HasAMultinodeConfig) {
  for (const std::string& m : supported_models())
    EXPECT_EQ(torchtune_config_exists(m + "_full_multinode"), m == "llama3_3/70B") << m;
  EXPECT_FALSE(torchtune_config_exists("llama3_2/1B_nonsense"));
  EXPECT_FALSE(torchtune_config_exists("nothing"));
}

}  // namespace
}  // namespace ktune
