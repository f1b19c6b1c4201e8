// Which engine runs a recipe (choose_step_device) and the GPU step's plan (plan_cuda_step): the
// config's device against what the build and the machine have; each model family's config.json
// (tests/model/fixtures) mapped to cuda::DecoderConfig, with a gap for every feature the GPU step
// lacks; LoRA placement from torchtune's module names; and the recipe settings the GPU step refuses.
// All of it runs without a GPU. The run itself on a GPU: cuda_recipe_test.cpp.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/config.h"
#include "train/device_selection.h"
#include "train/recipe_config.h"
#include "train/recipe_registry.h"

namespace ktune::train {
namespace {

model::ModelConfig family(const std::string& name) {
  return model::ModelConfig::from_file(std::string(KTUNE_SOURCE_DIR) + "/tests/model/fixtures/" + name + "/config.json");
}

// The bundled tiny config (dtype fp32, for the CPU) in bf16, as GPU runs train, then `overrides`.
RecipeConfig tiny(const std::string& recipe, const std::vector<std::string>& overrides = {}) {
  const std::string config = recipe.rfind("lora", 0) == 0 ? "tiny/lora_single_device" : "tiny/full_single_device";
  std::vector<std::string> all = {"dtype=bf16"};
  all.insert(all.end(), overrides.begin(), overrides.end());
  return prepare_recipe_config(recipe, config, all);
}

bool mentions(const std::vector<std::string>& gaps, const std::string& part) {
  for (const std::string& g : gaps)
    if (g.find(part) != std::string::npos) return true;
  return false;
}

TEST(ChooseStepDevice, CpuIsTheCpuWhateverTheMachineHas) {
  EXPECT_EQ(choose_step_device("cpu", true, 8).device, StepDevice::kCpu);
  EXPECT_EQ(choose_step_device("cpu", false, 0).device, StepDevice::kCpu);
}

TEST(ChooseStepDevice, CudaRunsOnTheGpuOnlyWhenTheBuildHasTheBackendAndAGpuIsVisible) {
  const DeviceChoice gpu = choose_step_device("cuda", true, 2);
  EXPECT_EQ(gpu.device, StepDevice::kCuda);
  EXPECT_NE(gpu.reason.find("training on the GPU (2 visible)"), std::string::npos) << gpu.reason;

  const DeviceChoice no_backend = choose_step_device("cuda", false, 2);
  EXPECT_EQ(no_backend.device, StepDevice::kCpu);
  EXPECT_NE(no_backend.reason.find("no CUDA backend"), std::string::npos) << no_backend.reason;

  const DeviceChoice no_gpu = choose_step_device("cuda", true, 0);
  EXPECT_EQ(no_gpu.device, StepDevice::kCpu);
  EXPECT_NE(no_gpu.reason.find("no GPU is visible"), std::string::npos) << no_gpu.reason;
}

TEST(PlanCudaStep, TheTinyLlamaLoraConfigMapsWholeWithNoGap) {
  const RecipeConfig cfg = tiny("lora_finetune_single_device");
  const model::ModelConfig mc = family("llama");
  const CudaStepPlan plan = plan_cuda_step(cfg, *find_recipe("lora_finetune_single_device"), mc, 8, 256);
  EXPECT_TRUE(plan.gaps.empty()) << describe_gaps(plan.gaps);
  EXPECT_EQ(plan.model.vocab_size, mc.vocab_size);
  EXPECT_EQ(plan.model.hidden_size, mc.hidden_size);
  EXPECT_EQ(plan.model.num_layers, mc.num_layers);
  EXPECT_EQ(plan.model.num_heads, mc.num_heads);
  EXPECT_EQ(plan.model.num_kv_heads, mc.num_kv_heads);
  EXPECT_EQ(plan.model.head_dim, mc.head_dim);
  EXPECT_EQ(plan.model.intermediate_size, mc.intermediate_size);
  EXPECT_EQ(plan.model.rms_norm_eps, mc.rms_norm_eps);
  EXPECT_EQ(plan.model.rope_theta, mc.rope_theta);
  EXPECT_EQ(plan.model.rope_scaling.type, mc.rope_scaling.type);
  EXPECT_EQ(plan.model.tie_word_embeddings, mc.tie_word_embeddings);
  EXPECT_EQ(plan.setup.batch, 8);
  EXPECT_EQ(plan.setup.seq_len, 256);
  EXPECT_FALSE(plan.setup.full_finetune);
  EXPECT_EQ(plan.setup.lora_rank, 8);
  EXPECT_FLOAT_EQ(plan.setup.lora_alpha, 16.0f);
  // lora_attn_modules [q_proj, k_proj, v_proj, output_proj] + apply_lora_to_mlp: all seven.
  for (int p = 0; p < cuda::kNumProjections; ++p) EXPECT_TRUE(plan.setup.lora_on[p]) << "projection " << p;
}

TEST(PlanCudaStep, LoraGoesOnTheProjectionsTorchtuneNamesOnly) {
  const RecipeConfig cfg = tiny("lora_finetune_single_device",
                                {"model.lora_attn_modules=[q_proj,output_proj]", "model.apply_lora_to_mlp=False",
                                 "model.lora_rank=4", "model.lora_alpha=8"});
  const CudaStepPlan plan = plan_cuda_step(cfg, *find_recipe("lora_finetune_single_device"), family("llama"), 2, 64);
  EXPECT_TRUE(plan.gaps.empty()) << describe_gaps(plan.gaps);
  const bool expected[cuda::kNumProjections] = {true, false, false, true, false, false, false};  // q, o
  for (int p = 0; p < cuda::kNumProjections; ++p) EXPECT_EQ(plan.setup.lora_on[p], expected[p]) << "projection " << p;
  EXPECT_EQ(plan.setup.lora_rank, 4);
  EXPECT_FLOAT_EQ(plan.setup.lora_alpha, 8.0f);
}

TEST(PlanCudaStep, QloraDoraAndLoraDropoutGoToTheGpuStepAsConfigured) {
  const RecipeConfig cfg = tiny("lora_finetune_single_device",
                                {"model.quantize_base=True", "model.lora_dropout=0.25", "model.use_dora=True"});
  const CudaStepPlan plan = plan_cuda_step(cfg, *find_recipe("lora_finetune_single_device"), family("llama"), 2, 64);
  EXPECT_TRUE(plan.gaps.empty()) << describe_gaps(plan.gaps);
  EXPECT_TRUE(plan.setup.quantize_base);
  EXPECT_TRUE(plan.setup.use_dora);
  EXPECT_FLOAT_EQ(plan.setup.lora_dropout, 0.25f);
  const CudaStepPlan plain =
      plan_cuda_step(tiny("lora_finetune_single_device"), *find_recipe("lora_finetune_single_device"), family("llama"), 2, 64);
  EXPECT_FALSE(plain.setup.quantize_base);
  EXPECT_FALSE(plain.setup.use_dora);
  EXPECT_EQ(plain.setup.lora_dropout, 0.0f);
}

// As the CPU recipe attaches model::FrozenNf4Adapter: the layers' unadapted projections NF4 too under
// QLoRA for the families whose torchtune QLoRA builders quantise them (all but Qwen2), never without it.
TEST(PlanCudaStep, QloraQuantisesTheUnadaptedProjectionsAsTorchtunesBuildersForTheFamily) {
  const RecipeConfig qlora = tiny("lora_finetune_single_device", {"model.quantize_base=True"});
  const RecipeConfig lora = tiny("lora_finetune_single_device");
  const RecipeSpec& recipe = *find_recipe("lora_finetune_single_device");
  for (const std::string name : {"llama", "mistral", "gemma2", "qwen2"}) {
    const bool unadapted = name != "qwen2";
    EXPECT_EQ(plan_cuda_step(qlora, recipe, family(name), 2, 64).setup.quantize_unadapted, unadapted) << name;
    EXPECT_FALSE(plan_cuda_step(lora, recipe, family(name), 2, 64).setup.quantize_unadapted) << name;
  }
}

TEST(PlanCudaStep, ActivationCheckpointingAndOffloadingGoToTheGpuStepAsConfigured) {
  for (const std::string recipe : {"lora_finetune_single_device", "full_finetune_single_device"}) {
    for (int setting = 0; setting < 3; ++setting) {  // neither, checkpointing, checkpointing + offloading
      const bool checkpointing = setting >= 1, offloading = setting == 2;
      const RecipeConfig cfg =
          tiny(recipe, {std::string("enable_activation_checkpointing=") + (checkpointing ? "True" : "False"),
                        std::string("enable_activation_offloading=") + (offloading ? "True" : "False")});
      const CudaStepPlan plan = plan_cuda_step(cfg, *find_recipe(recipe), family("llama"), 2, 64);
      EXPECT_TRUE(plan.gaps.empty()) << recipe << ": " << describe_gaps(plan.gaps);
      EXPECT_EQ(plan.setup.activation_checkpointing, checkpointing) << recipe;
      EXPECT_EQ(plan.setup.activation_offloading, offloading) << recipe;
    }
  }
}

TEST(PlanCudaStep, AFullFinetuneTrainsEveryBaseWeightAndAttachesNoAdapter) {
  const RecipeConfig cfg = tiny("full_finetune_single_device");
  const CudaStepPlan plan = plan_cuda_step(cfg, *find_recipe("full_finetune_single_device"), family("llama"), 4, 128);
  EXPECT_TRUE(plan.gaps.empty()) << describe_gaps(plan.gaps);
  EXPECT_TRUE(plan.setup.full_finetune);
  EXPECT_EQ(plan.setup.lora_rank, 0);
}

TEST(PlanCudaStep, RecipeSettingsTheGpuStepLacksAreEachAGap) {
  const RecipeSpec& lora = *find_recipe("lora_finetune_single_device");
  const model::ModelConfig llama = family("llama");
  auto gaps = [&](const std::vector<std::string>& overrides) {
    return plan_cuda_step(tiny("lora_finetune_single_device", overrides), lora, llama, 2, 64).gaps;
  };
  EXPECT_TRUE(mentions(gaps({"dtype=fp32"}), "dtype=fp32"));
  EXPECT_TRUE(gaps({"model.use_dora=True"}).empty());  // DoRA, QLoRA and LoRA dropout: the GPU step has them
  EXPECT_TRUE(gaps({"model.quantize_base=True"}).empty());
  EXPECT_TRUE(gaps({"model.lora_dropout=0.1"}).empty());
  EXPECT_TRUE(gaps({"model.apply_lora_to_output=True"}).empty());  // LoRA on lm_head: in the fused loss
  EXPECT_TRUE(gaps({"model.apply_lora_to_output=True", "model.use_dora=True"}).empty());  // DoRA on lm_head too
  EXPECT_TRUE(gaps({"dataset.packed=True"}).empty());  // packed datasets: the step masks documents
  EXPECT_TRUE(gaps({}).empty());
}

// torchtune's Mistral 7B LoRA and QLoRA configs (apply_lora_to_output: True) on Mistral's untied head:
// no gap; LoRA on lm_head beside the projections, its base NF4 under QLoRA (the step's quantize_base
// covers every adapted base); with use_dora, DoRA on lm_head too (no gap: the fused loss has it).
TEST(PlanCudaStep, LoraOnTheOutputProjectionGoesToTheGpuStep) {
  const model::ModelConfig mistral = family("mistral");
  ASSERT_FALSE(mistral.tie_word_embeddings);
  for (const auto& [recipe, config] : {std::pair{"lora_finetune_single_device", "mistral/7B_lora_single_device"},
                                       std::pair{"lora_finetune_distributed", "mistral/7B_lora"},
                                       std::pair{"lora_finetune_distributed", "mistral/7B_qlora"}}) {
    const RecipeConfig cfg = prepare_recipe_config(recipe, config, {"dtype=bf16"});
    ASSERT_TRUE(cfg.model.apply_lora_to_output) << config;
    const CudaStepPlan plan = plan_cuda_step(cfg, *find_recipe(recipe), mistral, 2, 64);
    EXPECT_TRUE(plan.gaps.empty()) << config << ": " << describe_gaps(plan.gaps);
    EXPECT_TRUE(plan.setup.lora_on_output) << config;
    EXPECT_EQ(plan.setup.quantize_base, std::string(config) == "mistral/7B_qlora") << config;
    const bool expected[cuda::kNumProjections] = {true, false, true, true, true, true, true};  // q, v, o, mlp
    for (int p = 0; p < cuda::kNumProjections; ++p) EXPECT_EQ(plan.setup.lora_on[p], expected[p]) << config << " " << p;
  }
  const RecipeSpec& lora = *find_recipe("lora_finetune_single_device");
  const CudaStepPlan off = plan_cuda_step(tiny("lora_finetune_single_device"), lora, mistral, 2, 64);
  EXPECT_FALSE(off.setup.lora_on_output);
  const CudaStepPlan dora = plan_cuda_step(
      tiny("lora_finetune_single_device", {"model.apply_lora_to_output=True", "model.use_dora=True"}), lora, mistral, 2, 64);
  EXPECT_TRUE(dora.gaps.empty()) << describe_gaps(dora.gaps);
  EXPECT_TRUE(dora.setup.lora_on_output && dora.setup.use_dora);
}

TEST(PlanCudaStep, QwenMistralAndGemmaMapFieldForField) {
  const RecipeConfig cfg = tiny("lora_finetune_single_device");
  const RecipeSpec& lora = *find_recipe("lora_finetune_single_device");

  const model::ModelConfig qwen = family("qwen2");
  const CudaStepPlan q = plan_cuda_step(cfg, lora, qwen, 2, 64);
  EXPECT_TRUE(q.gaps.empty()) << describe_gaps(q.gaps);
  EXPECT_TRUE(qwen.qkv_bias);
  EXPECT_TRUE(q.model.qkv_bias);

  const model::ModelConfig mistral = family("mistral");
  const CudaStepPlan m = plan_cuda_step(cfg, lora, mistral, 2, 64);
  EXPECT_TRUE(m.gaps.empty()) << describe_gaps(m.gaps);
  EXPECT_EQ(m.model.sliding_window, mistral.sliding_window);
  EXPECT_EQ(m.model.window(0), 6);

  const model::ModelConfig gemma = family("gemma2");
  const CudaStepPlan g = plan_cuda_step(cfg, lora, gemma, 2, 64);
  EXPECT_TRUE(g.gaps.empty()) << describe_gaps(g.gaps);
  EXPECT_EQ(g.model.sliding_window, gemma.sliding_window);
  EXPECT_EQ(g.model.attn_logit_softcap, gemma.attn_logit_softcap);
  EXPECT_EQ(g.model.final_logit_softcap, gemma.final_logit_softcap);
  EXPECT_GT(g.model.final_logit_softcap, 0.0f);
  EXPECT_EQ(g.model.norm_weight_offset, 1.0f);
  EXPECT_TRUE(g.model.sandwich_norms);
  EXPECT_TRUE(g.model.scale_embeddings);
  EXPECT_EQ(g.model.activation, cuda::DecoderConfig::Activation::kGeluTanh);
  EXPECT_EQ(g.model.attention_scale, gemma.attention_scale);  // query_pre_attn_scalar^-0.5, not head_dim's
  EXPECT_NE(g.model.attention_scale, 0.0f);

  // Llama's scale is head_dim^-0.5: left 0, the GPU's own default.
  EXPECT_EQ(plan_cuda_step(cfg, lora, family("llama"), 2, 64).model.attention_scale, 0.0f);
}

TEST(PlanCudaStep, LlamasAttentionAndMlpBiasesGoToTheGpuStep) {
  const RecipeConfig cfg = tiny("lora_finetune_single_device");
  const RecipeSpec& lora = *find_recipe("lora_finetune_single_device");
  model::ModelConfig biased = family("llama");
  biased.qkv_bias = biased.o_bias = true;  // attention_bias
  biased.mlp_bias = true;
  const CudaStepPlan plan = plan_cuda_step(cfg, lora, biased, 2, 64);
  EXPECT_TRUE(plan.gaps.empty()) << describe_gaps(plan.gaps);
  EXPECT_TRUE(plan.model.qkv_bias && plan.model.o_bias && plan.model.mlp_bias);
  const CudaStepPlan plain = plan_cuda_step(cfg, lora, family("llama"), 2, 64);
  EXPECT_FALSE(plain.model.qkv_bias || plain.model.o_bias || plain.model.mlp_bias);
}

TEST(PlanCudaStep, AGapNamesWhatTheGpuStepDoesNotDoAndTheWayOut) {
  const RecipeConfig cfg = tiny("lora_finetune_single_device", {"dtype=fp32"});
  const std::vector<std::string> gaps =
      plan_cuda_step(cfg, *find_recipe("lora_finetune_single_device"), family("llama"), 2, 64).gaps;
  EXPECT_TRUE(mentions(gaps, "dtype=fp32")) << describe_gaps(gaps);
  const std::string text = describe_gaps(gaps);
  EXPECT_NE(text.find("the GPU step does not do dtype=fp32"), std::string::npos) << text;
  EXPECT_NE(text.find("Set device=cpu"), std::string::npos) << text;
}

}  // namespace
}  // namespace ktune::train
