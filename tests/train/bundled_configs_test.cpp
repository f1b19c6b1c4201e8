// Every bundled config parses and validates for its recipe; the set covers every name the
// control plane's recipe table can produce; the files are what configs/generate.py writes; and
// torchtune 0.6.1's own YAMLs (fixtures/torchtune/) validate too.
#include <gtest/gtest.h>

#include <cstdlib>
#include <set>

#include "core/error.h"
#include "train/config_schema.h"
#include "train/recipe_config.h"
#include "train/recipe_registry.h"

using namespace ktune::train;

TEST(BundledConfigs, EveryConfigValidatesForItsRecipeAndTypes) {
  std::vector<std::string> names = bundled_config_names();
  ASSERT_EQ(names.size(), 82u);
  for (const std::string& name : names) {
    const RecipeSpec* recipe = recipe_for_config_name(name);
    ASSERT_NE(recipe, nullptr) << name;
    try {
      RecipeConfig c = prepare_recipe_config(recipe->name, name, {});
      EXPECT_EQ(c.model.lora, recipe->lora) << name;
      EXPECT_FALSE(c.checkpointer.checkpoint_files.empty()) << name;
      EXPECT_EQ(c.checkpointer.output_dir, c.output_dir) << name;
      EXPECT_EQ(c.metric_logger.log_dir, c.output_dir + "/logs") << name;
      EXPECT_EQ(c.model.quantize_base, name.find("qlora") != std::string::npos) << name;
    } catch (const std::exception& e) {
      ADD_FAILURE() << name << " for " << recipe->name << ":\n" << e.what();
    }
  }
}

TEST(BundledConfigs, ConfigsAreRefusedByTheOtherKindOfRecipe) {
  // A LoRA config on a full recipe (and back) is caught, not silently run.
  EXPECT_THROW(prepare_recipe_config("full_finetune_single_device", "llama3_2/1B_lora_single_device", {}), ktune::Errors);
  EXPECT_THROW(prepare_recipe_config("lora_finetune_single_device", "llama3_2/1B_full_single_device", {}), ktune::Errors);
}

TEST(BundledConfigs, CoverEveryNameTheControlPlaneCanProduce) {
  // upstream-compat.md: runtimes torchtune-<family><version>-<size> and the recipe table's suffixes.
  const std::vector<std::string> models = {"llama3_2/1B",  "llama3_2/3B",  "llama3_1/8B", "llama3_1/70B", "llama3_3/70B",
                                           "qwen2_5/0.5B", "qwen2_5/1.5B", "qwen2_5/3B",  "qwen2_5/7B",   "gemma2/2B",
                                           "gemma2/9B",    "gemma2/27B",   "mistral/7B"};
  const std::vector<std::pair<std::string, std::string>> table = {
      {"_qlora_single_device", "lora_finetune_single_device"}, {"_lora_single_device", "lora_finetune_single_device"},
      {"_full_single_device", "full_finetune_single_device"},  {"_qlora", "lora_finetune_distributed"},
      {"_lora", "lora_finetune_distributed"},                  {"_full", "full_finetune_distributed"}};
  for (const std::string& m : models) {
    for (const auto& [suffix, recipe] : table) {
      std::string name = m + suffix;
      EXPECT_NE(bundled_config_text(name), nullptr) << name;
      const RecipeSpec* r = find_recipe(recipe);
      EXPECT_NE(std::find(r->configs.begin(), r->configs.end(), name), r->configs.end()) << name << " in " << recipe;
    }
  }
  EXPECT_NE(bundled_config_text("llama3_1/70B_full_multinode"), nullptr);
  EXPECT_NE(bundled_config_text("llama3_3/70B_full_multinode.yaml"), nullptr);
  EXPECT_EQ(recipe_for_config_name("llama3_3/70B_full_multinode")->name, "full_finetune_distributed");
  EXPECT_EQ(recipe_for_config_name("tiny/lora_single_device")->name, "lora_finetune_single_device");
}

TEST(BundledConfigs, DefaultsAreTorchtunes) {
  // Spot checks against torchtune 0.6.1's YAMLs (the generator's table holds all of them).
  auto c = prepare_recipe_config("lora_finetune_single_device", "llama3_2/1B_lora_single_device", {});
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 3e-4);
  EXPECT_EQ(c.batch_size, 4);
  EXPECT_EQ(c.model.lora_rank, 64);
  EXPECT_DOUBLE_EQ(c.model.lora_alpha, 128);
  EXPECT_EQ(c.gradient_accumulation_steps, 8);
  auto q = prepare_recipe_config("lora_finetune_distributed", "qwen2_5/1.5B_lora", {});
  EXPECT_DOUBLE_EQ(q.optimizer.lr, 2e-5);
  EXPECT_EQ(q.model.lora_rank, 32);
  EXPECT_EQ(q.batch_size, 2);
  auto g = prepare_recipe_config("lora_finetune_single_device", "gemma2/9B_lora_single_device", {});
  EXPECT_EQ(g.model.lora_rank, 8);
  EXPECT_DOUBLE_EQ(g.optimizer.lr, 5e-5);
  EXPECT_EQ(g.batch_size, 8);
  auto m = prepare_recipe_config("full_finetune_distributed", "mistral/7B_full", {});
  EXPECT_DOUBLE_EQ(m.optimizer.lr, 5e-6);
}

TEST(BundledConfigs, FilesAreWhatTheGeneratorWrites) {
  if (std::system("python3 --version > /dev/null 2>&1") != 0) GTEST_SKIP() << "python3 not available";
  std::string cmd = "python3 " + std::string(KTUNE_SOURCE_DIR) + "/configs/generate.py --check";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << "configs/ differ from configs/generate.py; rerun it";
}

TEST(BundledConfigs, ValuesMatchTorchtunesYamlsExceptDocumentedDifferences) {
  // Needs torchtune 0.6.1's YAMLs: KTUNE_TORCHTUNE_CONFIGS=<wheel>/recipes/configs (a scratch
  // `pip install torchtune==0.6.1 --no-deps`); ktune itself does not depend on torchtune.
  const char* dir = std::getenv("KTUNE_TORCHTUNE_CONFIGS");
  if (dir == nullptr) GTEST_SKIP() << "KTUNE_TORCHTUNE_CONFIGS not set (torchtune's recipes/configs directory)";
  if (std::system("python3 -c 'import yaml' > /dev/null 2>&1") != 0) GTEST_SKIP() << "python3 with pyyaml needed";
  std::string cmd = "python3 " + std::string(KTUNE_SOURCE_DIR) + "/configs/compare_with_torchtune.py " + dir;
  EXPECT_EQ(std::system(cmd.c_str()), 0);
}

TEST(BundledConfigs, TorchtunesOwnYamlsValidate) {
  const std::string dir = std::string(KTUNE_SOURCE_DIR) + "/tests/train/fixtures/torchtune/";
  struct Case {
    const char* file;
    const char* recipe;
    std::vector<std::string> overrides;
  };
  const std::vector<Case> cases = {
      {"llama3_2_1B_lora_single_device.yaml", "lora_finetune_single_device", {}},
      {"qwen2_5_1.5B_lora.yaml", "lora_finetune_distributed", {}},
      {"llama3_3_70B_full_multinode.yaml", "full_finetune_distributed", {}},
      {"gemma2_2B_qlora_single_device.yaml", "lora_finetune_single_device", {}},
      // torchtune's full single-device configs use bitsandbytes; with AdamW they validate.
      {"llama3_2_1B_full_single_device.yaml", "full_finetune_single_device", {"optimizer=torch.optim.AdamW"}},
  };
  for (const Case& c : cases) {
    try {
      RecipeConfig rc = prepare_recipe_config(c.recipe, dir + c.file, c.overrides);
      EXPECT_FALSE(rc.model.family.empty()) << c.file;
    } catch (const std::exception& e) {
      ADD_FAILURE() << c.file << ":\n" << e.what();
    }
  }
  // And the bitsandbytes one as shipped is refused with the reason.
  try {
    prepare_recipe_config("full_finetune_single_device", dir + "llama3_2_1B_full_single_device.yaml", {});
    FAIL();
  } catch (const ktune::Errors& e) {
    ASSERT_EQ(e.errors().size(), 1u) << e.what();
    EXPECT_NE(std::string(e.what()).find("bitsandbytes.optim.PagedAdamW8bit` is not supported by ktune"),
              std::string::npos);
  }
}

TEST(BundledConfigs, UpstreamSdkArgumentsAreAcceptedOnTheConfigsTheControlPlanePicks) {
  // The exact args the kubeflow SDK renders for a TorchTuneConfig with a LoraConfig, plus the
  // runtime-owned ones the controller appends (upstream-compat.md).
  const std::vector<std::string> sdk = {
      "output_dir=/workspace/output", "tokenizer.path=/workspace/model/original/tokenizer.model",
      "checkpointer.checkpoint_dir=/workspace/model", "dtype=bf16", "batch_size=2", "epochs=1",
      "loss=torchtune.modules.loss.CEWithChunkedOutputLoss", "dataset.data_dir=/workspace/dataset/data",
      "model.lora_rank=8", "model.lora_attn_modules=[q_proj,v_proj]", "dataset=torchtune.datasets.instruct_dataset",
      "dataset.source=parquet", "dataset.column_map={'input': 'question'}", "model.apply_lora_to_mlp=True"};
  for (const char* config : {"llama3_2/1B_lora_single_device", "llama3_2/1B_lora", "llama3_1/8B_lora_single_device"}) {
    const RecipeSpec* r = recipe_for_config_name(config);
    try {
      RecipeConfig c = prepare_recipe_config(r->name, config, sdk);
      EXPECT_EQ(c.model.lora_rank, 8);
      EXPECT_EQ(c.datasets[0].column_map.at("input"), "question");
      EXPECT_EQ(c.checkpointer.checkpoint_dir, "/workspace/model");
      EXPECT_EQ(c.checkpointer.output_dir, "/workspace/output");
    } catch (const std::exception& e) {
      ADD_FAILURE() << config << ": " << e.what();
    }
  }
  // Qwen: the runtime passes vocab.json and merges.txt; QLoRA via quantize_base.
  std::vector<std::string> qwen = {"output_dir=/workspace/output", "tokenizer.path=/workspace/model/vocab.json",
                                   "tokenizer.merges_file=/workspace/model/merges.txt",
                                   "checkpointer.checkpoint_dir=/workspace/model", "model.quantize_base=True",
                                   "model.lora_attn_modules=[q_proj,v_proj,output_proj]"};
  RecipeConfig q = prepare_recipe_config("lora_finetune_single_device", "qwen2_5/1.5B_qlora_single_device", qwen);
  EXPECT_TRUE(q.model.quantize_base);
  // Full fine-tune: the runtime's node command.
  std::vector<std::string> full = {"dataset=torchtune.datasets.instruct_dataset", "dataset.source=parquet",
                                   "dataset.data_dir=/workspace/dataset/data", "output_dir=/workspace/output",
                                   "tokenizer.path=/workspace/model/original/tokenizer.model",
                                   "checkpointer.checkpoint_dir=/workspace/model"};
  EXPECT_NO_THROW(prepare_recipe_config("full_finetune_distributed", "llama3_2/1B_full", full));
}
