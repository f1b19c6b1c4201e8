// Validation before anything loads: every refusal names its key, what was expected, and the
// nearest valid name; all problems come together.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/error.h"
#include "train/config_schema.h"
#include "train/prompt_templates.h"
#include "train/recipe_config.h"
#include "train/recipe_registry.h"

using ktune::train::prepare_recipe_config;

namespace {

// The messages `ktune run RECIPE --config CONFIG overrides…` refuses with ("" when it accepts).
std::string refusal(const std::string& recipe, const std::string& config, const std::vector<std::string>& overrides) {
  try {
    prepare_recipe_config(recipe, config, overrides);
  } catch (const ktune::Errors& e) {
    std::string out;
    for (const auto& x : e.errors()) out += std::string(x.what()) + "\n";
    return out;
  } catch (const ktune::Error& e) {
    return e.what();
  }
  return "";
}

const char* kLora = "lora_finetune_single_device";
const char* kLoraCfg = "llama3_2/1B_lora_single_device";
const char* kFull = "full_finetune_single_device";
const char* kFullCfg = "llama3_2/1B_full_single_device";

#define EXPECT_HAS(haystack, needle) EXPECT_NE((haystack).find(needle), std::string::npos) << (haystack)

}  // namespace

TEST(ConfigSchema, BundledConfigWithoutOverridesIsAccepted) {
  EXPECT_EQ(refusal(kLora, kLoraCfg, {}), "");
  EXPECT_EQ(refusal(kFull, kFullCfg, {}), "");
}

TEST(ConfigSchema, UnknownTopLevelKeySuggestsNearest) {
  std::string m = refusal(kLora, kLoraCfg, {"batch_szie=2"});
  EXPECT_HAS(m, "config key batch_szie: unknown key for recipe lora_finetune_single_device");
  EXPECT_HAS(m, "did you mean `batch_size`?");
}

TEST(ConfigSchema, UnknownComponentKeySuggestsFullPath) {
  std::string m = refusal(kLora, kLoraCfg, {"optimizer.lrr=1e-4"});
  EXPECT_HAS(m, "config key optimizer.lrr: unknown key for torch.optim.AdamW; did you mean `optimizer.lr`?");
  m = refusal(kLora, kLoraCfg, {"model.lora_rnak=4"});
  EXPECT_HAS(m, "did you mean `model.lora_rank`?");
}

// A refusal leads with where the value was written: the config file's line, or the override.
TEST(ConfigSchema, RefusalsNameTheFileAndLineOrTheOverride) {
  const std::string path = ::testing::TempDir() + "ktune_schema_origin_" + std::to_string(::getpid()) + ".yaml";
  std::ofstream(path) << *ktune::train::bundled_config_text(kLoraCfg) << "\nbatch_szie: 2\n";
  const int line = [&] {
    std::ifstream in(path);
    int n = 0;
    for (std::string l; std::getline(in, l);) ++n;
    return n;
  }();
  std::string m = refusal(kLora, path, {"shuffle=maybe"});
  EXPECT_HAS(m, path + ":" + std::to_string(line) + ": config key batch_szie: unknown key for recipe");
  EXPECT_HAS(m, "override `shuffle=maybe`: config key shuffle: expected a bool (true/false), got string maybe");
  m = refusal(kLora, path, {"optimizer={lrr: 1e-4}"});
  EXPECT_HAS(m, "override `optimizer={lrr: 1e-4}`: config key optimizer.lrr: unknown key for torch.optim.AdamW");
  std::remove(path.c_str());
}

TEST(ConfigSchema, WrongTypesNameTheExpectedType) {
  std::string m = refusal(kLora, kLoraCfg, {"batch_size=two", "shuffle=maybe", "optimizer.lr=fast",
                                            "model.lora_attn_modules=q_proj", "epochs=1.5"});
  EXPECT_HAS(m, "config key batch_size: expected an int >= 1, got string two");
  EXPECT_HAS(m, "config key shuffle: expected a bool (true/false), got string maybe");
  EXPECT_HAS(m, "config key optimizer.lr: expected a float >= 0, got string fast");
  EXPECT_HAS(m, "config key model.lora_attn_modules: expected a list of strings");
  EXPECT_HAS(m, "config key epochs: expected an int >= 1, got float 1.5");
}

TEST(ConfigSchema, RangesAreChecked) {
  std::string m = refusal(kLora, kLoraCfg, {"batch_size=0", "model.lora_rank=0", "model.lora_dropout=1.0",
                                            "gradient_accumulation_steps=-1", "max_steps_per_epoch=0"});
  EXPECT_HAS(m, "config key batch_size: expected an int >= 1, got 0");
  EXPECT_HAS(m, "config key model.lora_rank: expected an int >= 1, got 0");
  EXPECT_HAS(m, "config key model.lora_dropout: expected a float in [0, 1), got 1");
  EXPECT_HAS(m, "config key gradient_accumulation_steps");
  EXPECT_HAS(m, "config key max_steps_per_epoch");
}

TEST(ConfigSchema, AdamWBetasAreTwoFloatsBelowOne) {
  EXPECT_EQ(refusal(kLora, kLoraCfg, {"optimizer.betas=[0.9, 0.95]"}), "");
  EXPECT_HAS(refusal(kLora, kLoraCfg, {"optimizer.betas=[0.9]"}), "config key optimizer.betas: expected a list of two floats");
  EXPECT_HAS(refusal(kLora, kLoraCfg, {"optimizer.betas=[0.9, 1.5]"}), "config key optimizer.betas.1: expected a float in [0, 1), got 1.5");
  auto c = prepare_recipe_config(kLora, kLoraCfg, {"optimizer.betas=[0.8, 0.95]"});
  EXPECT_DOUBLE_EQ(c.optimizer.beta1, 0.8);
  EXPECT_DOUBLE_EQ(c.optimizer.beta2, 0.95);
}

TEST(ConfigSchema, Fp16IsRefusedWithTheReason) {
  std::string m = refusal(kLora, kLoraCfg, {"dtype=fp16"});
  EXPECT_HAS(m, "config key dtype: fp16 is not supported (torchtune refuses it too): use bf16 or fp32");
  EXPECT_HAS(refusal(kLora, kLoraCfg, {"dtype=bf61"}), "did you mean `bf16`?");
  EXPECT_EQ(refusal(kLora, kLoraCfg, {"dtype=fp32"}), "");
}

TEST(ConfigSchema, LoraKeysOnAFullRecipeAreRefused) {
  std::string m = refusal(kFull, kFullCfg, {"model.lora_rank=8", "model.quantize_base=True"});
  EXPECT_HAS(m, "config key model.lora_rank: a LoRA setting, but `torchtune.models.llama3_2.llama3_2_1b` is a "
                "full-model builder");
  EXPECT_HAS(m, "config key model.quantize_base: a QLoRA setting");
  EXPECT_HAS(refusal(kFull, kFullCfg, {"save_adapter_weights_only=True"}),
             "config key save_adapter_weights_only: not accepted by recipe full_finetune_single_device: only LoRA "
             "recipes (lora_finetune_*) accept it");
}

TEST(ConfigSchema, BuilderMustMatchRecipeKind) {
  std::string m = refusal(kFull, kFullCfg, {"model=torchtune.models.llama3_2.lora_llama3_2_1b"});
  EXPECT_HAS(m, "config key model._component_: `torchtune.models.llama3_2.lora_llama3_2_1b` is a LoRA builder, but "
                "recipe full_finetune_single_device trains all weights: use `torchtune.models.llama3_2.llama3_2_1b`");
  m = refusal(kLora, kLoraCfg, {"model=torchtune.models.llama3_2.llama3_2_1b"});
  EXPECT_HAS(m, "has no adapters, but recipe lora_finetune_single_device trains LoRA adapters");
}

TEST(ConfigSchema, UnknownComponentSuggestsNearestOfItsKind) {
  std::string m = refusal(kLora, kLoraCfg, {"model=torchtune.models.llama3_2.lora_llama3_2_1c"});
  EXPECT_HAS(m, "unknown model builder `torchtune.models.llama3_2.lora_llama3_2_1c`; did you mean "
                "`torchtune.models.llama3_2.lora_llama3_2_1b`?");
  m = refusal(kLora, kLoraCfg, {"optimizer=torch.optim.AdamWW"});
  EXPECT_HAS(m, "did you mean `torch.optim.AdamW`?");
}

TEST(ConfigSchema, ComponentOfTheWrongKindOrUnsupportedIsRefusedWithReason) {
  std::string m = refusal(kLora, kLoraCfg, {"optimizer=torchtune.modules.loss.CEWithChunkedOutputLoss"});
  EXPECT_HAS(m, "is a loss, not a optimizer");
  m = refusal(kFull, kFullCfg, {"optimizer=bitsandbytes.optim.PagedAdamW8bit"});
  EXPECT_HAS(m, "is not supported by ktune: bitsandbytes optimizers are CUDA-only");
  // torchtune's named datasets: the general builder and columns that make the same samples.
  m = refusal(kFull, kFullCfg, {"dataset=torchtune.datasets.samsum_dataset"});
  EXPECT_HAS(m, "is not supported by ktune: ktune has no builder of that name; with the data fetched (ktune download), "
                "torchtune.datasets.instruct_dataset with source: <folder>, column_map: {input: dialogue, output: summary}");
  m = refusal(kFull, kFullCfg, {"dataset=torchtune.datasets.stack_exchange_paired_dataset"});
  EXPECT_HAS(m, "preference pairs train DPO/PPO recipes");
}

TEST(ConfigSchema, ComponentWrittenAsPlainStringIsRefused) {
  // `loss=X` on a config without a loss section gives a string, not a component.
  ktune::train::ConfigNode t = ktune::train::load_config_yaml(*ktune::train::bundled_config_text(kLoraCfg), "c");
  t.set("loss", ktune::train::ConfigNode::string("torchtune.modules.loss.CEWithChunkedOutputLoss"));
  auto errors = ktune::train::check_config(t, *ktune::train::find_recipe(kLora));
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_HAS(std::string(errors[0].what()), "config key loss: expected a loss component (a map with _component_), got "
                                            "string torchtune.modules.loss.CEWithChunkedOutputLoss");
}

TEST(ConfigSchema, ImpossibleCombinationsAreRefused) {
  std::string m = refusal(kLora, kLoraCfg, {"dataset.packed=True"});
  EXPECT_HAS(m, "config key dataset.packed: packing fills sequences to tokenizer.max_seq_len, which is not set");
  EXPECT_EQ(refusal(kLora, kLoraCfg, {"dataset.packed=True", "tokenizer.max_seq_len=2048"}), "");

  m = refusal(kFull, kFullCfg, {"optimizer_in_bwd=True", "gradient_accumulation_steps=4", "clip_grad_norm=1.0"});
  EXPECT_HAS(m, "cannot be combined with gradient_accumulation_steps > 1");
  EXPECT_HAS(m, "cannot be combined with clip_grad_norm");

  m = refusal(kLora, kLoraCfg, {"tokenizer=torchtune.models.qwen2_5.qwen2_5_tokenizer"});
  EXPECT_HAS(m, "is a qwen2_5 tokenizer, but model `torchtune.models.llama3_2.lora_llama3_2_1b` is llama3_2");
  EXPECT_HAS(m, "config key tokenizer.merges_file: missing");

  m = refusal(kLora, kLoraCfg, {"checkpointer.model_type=QWEN2"});
  EXPECT_HAS(m, "config key checkpointer.model_type: `QWEN2` does not match model");

  m = refusal(kLora, kLoraCfg, {"dataset=torchtune.datasets.instruct_dataset", "dataset.source=parquet"});
  EXPECT_HAS(m, "source `parquet` is a file format: say where the files are");

  m = refusal(kLora, kLoraCfg, {"enable_activation_offloading=True", "enable_activation_checkpointing=False"});
  EXPECT_HAS(m, "needs enable_activation_checkpointing=True");

  m = refusal(kLora, kLoraCfg, {"optimizer.amsgrad=True"});
  EXPECT_HAS(m, "config key optimizer.amsgrad: ktune's AdamW is torch's default update, without amsgrad");
  EXPECT_EQ(refusal(kLora, kLoraCfg, {"optimizer.amsgrad=False"}), "");

  EXPECT_EQ(refusal(kLora, kLoraCfg, {"profiler.enabled=True"}), "");  // train/profiler.h records the steps
  m = refusal(kLora, kLoraCfg, {"profiler.enabled=True", "profiler.active_steps=0"});
  EXPECT_HAS(m, "config key profiler.active_steps: must be at least 1");
  m = refusal(kLora, kLoraCfg, {"profiler.wait_steps=-1"});
  EXPECT_HAS(m, "profiler.wait_steps");

  m = refusal(kLora, kLoraCfg, {"model.lora_attn_modules=[]", "model.apply_lora_to_mlp=False"});
  EXPECT_HAS(m, "LoRA would train nothing");

  m = refusal(kLora, kLoraCfg, {"model.lora_attn_modules=[q_proj,v_proj,q_proj]"});
  EXPECT_HAS(m, "config key model.lora_attn_modules: lists 'q_proj' twice (items 0 and 2)");
  m = refusal(kLora, kLoraCfg, {"model.lora_attn_modules=[q_proj,w_proj]"});
  EXPECT_HAS(m, "`w_proj` is not one of q_proj, k_proj, v_proj, output_proj");
}

TEST(ConfigSchema, DistributedOnlyKeysOnASingleDeviceRecipe) {
  std::string m = refusal(kLora, kLoraCfg, {"fsdp_cpu_offload=True"});
  EXPECT_HAS(m, "only distributed recipes (*_distributed) accept it");
  EXPECT_EQ(refusal("lora_finetune_distributed", "llama3_2/1B_lora", {"fsdp_cpu_offload=True"}), "");
}

TEST(ConfigSchema, MissingRequiredKeysAreNamed) {
  std::string m = refusal(kLora, kLoraCfg, {"~tokenizer.path", "~checkpointer.model_type", "~batch_size"});
  EXPECT_HAS(m, "config key tokenizer.path: missing: torchtune.models.llama3.llama3_tokenizer requires it");
  EXPECT_HAS(m, "config key checkpointer.model_type: missing");
  EXPECT_HAS(m, "config key batch_size: missing: recipe lora_finetune_single_device requires it (an int)");
}

TEST(ConfigSchema, AllProblemsOfAllStagesComeTogether) {
  try {
    prepare_recipe_config(kLora, kLoraCfg,
                          {"bad_override", "batch_size=0", "dtype=fp16", "optimizer.lrr=1", "log=${nope}"});
    FAIL();
  } catch (const ktune::Errors& e) {
    EXPECT_EQ(e.errors().size(), 6u) << e.what();  // + `log` is no key of the recipe
  }
}

TEST(ConfigSchema, UnknownRecipeAndConfigSuggestNearest) {
  EXPECT_HAS(refusal("lora_finetune_single_devices", kLoraCfg, {}), "did you mean `lora_finetune_single_device`?");
  EXPECT_HAS(refusal(kLora, "llama3_2/1B_lora_single_devise", {}), "did you mean `llama3_2/1B_lora_single_device`?");
}

TEST(ConfigSchema, TypedViewCarriesConfigValues) {
  auto c = prepare_recipe_config(kLora, kLoraCfg,
                                 {"model.lora_rank=8", "model.use_dora=True", "batch_size=2", "clip_grad_norm=inf",
                                  "seed=42", "dataset=torchtune.datasets.instruct_dataset", "dataset.source=parquet",
                                  "dataset.data_dir=/workspace/dataset/data", "dataset.column_map={'input': 'q'}",
                                  "output_dir=/workspace/output", "dtype=fp32", "save_every_n_steps=50"});
  EXPECT_EQ(c.recipe, kLora);
  EXPECT_EQ(c.model.family, "llama3_2");
  EXPECT_EQ(c.model.size, "1B");
  EXPECT_TRUE(c.model.lora);
  EXPECT_FALSE(c.model.quantize_base);
  EXPECT_TRUE(c.model.use_dora);
  EXPECT_EQ(c.model.lora_rank, 8);
  EXPECT_DOUBLE_EQ(c.model.lora_alpha, 128.0);
  EXPECT_EQ(c.model.lora_attn_modules, (std::vector<std::string>{"q_proj", "v_proj", "output_proj"}));
  EXPECT_TRUE(c.model.apply_lora_to_mlp);
  EXPECT_EQ(c.tokenizer.family, "llama3");
  EXPECT_FALSE(c.tokenizer.max_seq_len.has_value());
  EXPECT_EQ(c.checkpointer.output_dir, "/workspace/output");
  EXPECT_EQ(c.checkpointer.checkpoint_files, (std::vector<std::string>{"model.safetensors"}));
  ASSERT_EQ(c.datasets.size(), 1u);
  EXPECT_EQ(c.datasets[0].style, "instruct");
  EXPECT_EQ(c.datasets[0].source, "parquet");
  EXPECT_EQ(c.datasets[0].data_dir, "/workspace/dataset/data");
  EXPECT_EQ(c.datasets[0].column_map.at("input"), "q");
  EXPECT_FALSE(c.datasets[0].train_on_input);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 3e-4);
  EXPECT_DOUBLE_EQ(c.optimizer.weight_decay, 0.01);
  EXPECT_EQ(c.lr_scheduler.num_warmup_steps, 100);
  EXPECT_EQ(c.loss.component, "torchtune.modules.loss.CEWithChunkedOutputLoss");
  EXPECT_EQ(c.metric_logger.log_dir, "/workspace/output/logs");
  EXPECT_EQ(c.batch_size, 2);
  EXPECT_EQ(c.gradient_accumulation_steps, 8);
  ASSERT_TRUE(c.clip_grad_norm.has_value());
  EXPECT_TRUE(std::isinf(*c.clip_grad_norm));
  EXPECT_EQ(*c.seed, 42u);
  EXPECT_EQ(c.dtype, ktune::train::TrainDtype::FP32);
  EXPECT_EQ(*c.save_every_n_steps, 50);
}

TEST(ConfigSchema, DatasetMayBeAListOfDatasetComponents) {
  auto c = prepare_recipe_config(
      kLora, kLoraCfg,
      {"dataset=[{'_component_': 'torchtune.datasets.instruct_dataset', 'source': 'json', 'data_files': 'a.jsonl'}, "
       "{'_component_': 'torchtune.datasets.chat_dataset', 'source': 'json', 'data_files': ['b.jsonl', 'c.jsonl'], "
       "'conversation_column': 'messages', 'conversation_style': 'openai'}]"});
  ASSERT_EQ(c.datasets.size(), 2u);
  EXPECT_EQ(c.datasets[0].style, "instruct");
  EXPECT_EQ(c.datasets[0].data_files, (std::vector<std::string>{"a.jsonl"}));
  EXPECT_EQ(c.datasets[1].style, "chat");
  EXPECT_EQ(c.datasets[1].conversation_style, "openai");
  EXPECT_EQ(c.datasets[1].data_files.size(), 2u);
  std::string m = refusal(kLora, kLoraCfg,
                          {"dataset=[{'_component_': 'torchtune.datasets.chat_dataset', 'source': 'json', "
                           "'data_files': 'b.jsonl', 'conversation_style': 'chatml'}]"});
  EXPECT_HAS(m, "config key dataset.0.conversation_style: `chatml` is not one of sharegpt, openai");
  EXPECT_HAS(m, "config key dataset.0.conversation_column: missing");
}

TEST(ConfigSchema, TypedViewExpandsShardedCheckpointFileNames) {
  auto c = prepare_recipe_config("full_finetune_distributed", "llama3_3/70B_full_multinode", {});
  ASSERT_EQ(c.checkpointer.checkpoint_files.size(), 30u);
  EXPECT_EQ(c.checkpointer.checkpoint_files.front(), "model-00001-of-00030.safetensors");
  EXPECT_EQ(c.checkpointer.checkpoint_files.back(), "model-00030-of-00030.safetensors");
  EXPECT_TRUE(c.datasets[0].packed);
  EXPECT_EQ(*c.tokenizer.max_seq_len, 1024);
}

TEST(ConfigSchema, QloraFromBuilderOrFromQuantizeBase) {
  auto a = prepare_recipe_config(kLora, "llama3_2/1B_qlora_single_device", {});
  EXPECT_TRUE(a.model.quantize_base);
  auto b = prepare_recipe_config(kLora, kLoraCfg, {"model.quantize_base=True"});
  EXPECT_TRUE(b.model.quantize_base);
  auto q = prepare_recipe_config(kLora, "qwen2_5/0.5B_qlora_single_device", {});
  EXPECT_TRUE(q.model.quantize_base);
  EXPECT_EQ(q.tokenizer.merges_file, "/tmp/Qwen2.5-0.5B-Instruct/merges.txt");
}

// Packing as torchtune's builders pack: instruct, alpaca and chat datasets keep each sample whole in
// one pack (PackedDataset's split_across_pack=False, which they do not expose); text completion cuts
// the token stream at every pack's end unless its split_across_pack says otherwise.
TEST(ConfigSchema, PacksSplitSamplesOnlyForTextCompletionUnlessItSaysOtherwise) {
  using ktune::train::dataset_options;
  auto alpaca = prepare_recipe_config(kLora, kLoraCfg, {"dataset.packed=True", "tokenizer.max_seq_len=256"});
  EXPECT_FALSE(ktune::split_across_pack(dataset_options(alpaca.datasets.at(0))));
  const std::string text = "dataset._component_=torchtune.datasets.text_completion_dataset";
  const std::string source = "dataset.source=/data/corpus";  // a local directory: not read here
  auto split = prepare_recipe_config(kLora, kLoraCfg, {text, source, "dataset.packed=True", "tokenizer.max_seq_len=256"});
  EXPECT_TRUE(ktune::split_across_pack(dataset_options(split.datasets.at(0))));
  auto whole = prepare_recipe_config(kLora, kLoraCfg,
                                     {text, source, "dataset.packed=True", "dataset.split_across_pack=False", "tokenizer.max_seq_len=256"});
  EXPECT_FALSE(ktune::split_across_pack(dataset_options(whole.datasets.at(0))));
  EXPECT_HAS(refusal(kLora, kLoraCfg, {"dataset.split_across_pack=True"}), "split_across_pack");  // not alpaca's
}

// tokenizer.prompt_template: torchtune's templates by dotted name carry torchtune's own tags (those
// tests/data/fixtures/prompt_template_cases.json recorded from torchtune 0.6.1), a dict is a custom
// template, and anything else is refused by validation, naming the key and the templates that work.
TEST(ConfigSchema, PromptTemplatesByNameOrDictAsTorchtuneReadsThem) {
  using ktune::train::prompt_template_from_config;
  std::ifstream in(std::string(KTUNE_SOURCE_DIR) + "/tests/data/fixtures/prompt_template_cases.json");
  ASSERT_TRUE(in);
  int named = 0;
  for (const auto& c : nlohmann::json::parse(in)) {
    const std::string override_value = c.at("template").is_string()
                                           ? c.at("template").get<std::string>()
                                           : "{system: ['<<SYS>> ', ' <</SYS>>'], user: ['Q: ', \"\\nA: \"], assistant: ['', ' [END]']}";
    auto cfg = prepare_recipe_config(kLora, kLoraCfg, {"tokenizer.prompt_template=" + override_value});
    std::optional<ktune::PromptTemplate> t = prompt_template_from_config(cfg.tokenizer.prompt_template);
    ASSERT_TRUE(t.has_value()) << c.at("template");
    std::map<std::string, std::pair<std::string, std::string>> want;
    for (const auto& [role, tags] : c.at("tags").items()) want[role] = {tags.at(0), tags.at(1)};
    EXPECT_EQ(t->tags, want) << c.at("template");
    named += c.at("template").is_string();
  }
  EXPECT_GT(named, 0);
  auto none = prepare_recipe_config(kLora, kLoraCfg, {});
  EXPECT_FALSE(prompt_template_from_config(none.tokenizer.prompt_template).has_value());
  EXPECT_HAS(refusal(kLora, kLoraCfg, {"tokenizer.prompt_template=no.such.Template"}),
             "config key tokenizer.prompt_template: unknown prompt template `no.such.Template`; expected one of "
             "torchtune.data.GrammarErrorCorrectionTemplate");
  EXPECT_HAS(refusal(kLora, kLoraCfg, {"tokenizer.prompt_template=torchtune.data.ChatMLTemplate"}),
             "formats whole conversations its own way");
  EXPECT_HAS(refusal(kLora, kLoraCfg, {"tokenizer.prompt_template={robot: ['a', 'b']}"}),
             "config key tokenizer.prompt_template.robot: not a role");
  EXPECT_HAS(refusal(kLora, kLoraCfg, {"tokenizer.prompt_template={user: ['only one']}"}),
             "config key tokenizer.prompt_template.user: must be a list of two strings");
}
