// Device choice and the GPU step's plan (see device_selection.h).
#include "train/device_selection.h"

#include <cmath>

#include "model/adapters/frozen_nf4_adapter.h"
#include "model/adapters/lora_adapter.h"

namespace ktune::train {

DeviceChoice choose_step_device(const std::string& device, bool cuda_built, int gpu_count) {
  if (device == "cpu") return {StepDevice::kCpu, "device=cpu: training on the CPU"};
  if (!cuda_built)
    return {StepDevice::kCpu, "device=" + device + " asked for, but this build has no CUDA backend (KTUNE_CUDA=OFF): "
                                                   "training on the CPU"};
  if (gpu_count < 1)
    return {StepDevice::kCpu, "device=" + device + " asked for, but no GPU is visible (no driver, or "
                                                   "CUDA_VISIBLE_DEVICES hides them): training on the CPU"};
  return {StepDevice::kCuda, "device=" + device + ": training on the GPU (" + std::to_string(gpu_count) +
                                 " visible)"};
}

namespace {

// The architecture: cuda::DecoderConfig holds the CPU ModelConfig's fields one for one (llama,
// qwen2, mistral, gemma2); the biases it lacks are gaps.
cuda::DecoderConfig map_model(const model::ModelConfig& mc, std::vector<std::string>& gaps) {
  cuda::DecoderConfig c;
  c.vocab_size = mc.vocab_size;
  c.hidden_size = mc.hidden_size;
  c.num_layers = mc.num_layers;
  c.num_heads = mc.num_heads;
  c.num_kv_heads = mc.num_kv_heads;
  c.head_dim = mc.head_dim;
  c.intermediate_size = mc.intermediate_size;
  c.rms_norm_eps = mc.rms_norm_eps;
  c.rope_theta = mc.rope_theta;
  c.rope_scaling = mc.rope_scaling;
  c.tie_word_embeddings = mc.tie_word_embeddings;
  c.qkv_bias = mc.qkv_bias;
  c.sliding_window = mc.sliding_window;
  // 0 keeps the GPU's own 1/sqrt(head_dim) where the config's is that (ModelConfig computes it in
  // double, which may differ in the last bit); gemma2's query_pre_attn_scalar^-0.5 is copied.
  const float default_scale = 1.0f / std::sqrt(float(mc.head_dim));
  const bool default_attention_scale =
      mc.attention_scale <= 0 || std::fabs(mc.attention_scale - default_scale) <= 1e-6f * default_scale;
  c.attention_scale = default_attention_scale ? 0.0f : mc.attention_scale;
  c.attn_logit_softcap = mc.attn_logit_softcap;
  c.final_logit_softcap = mc.final_logit_softcap;
  c.norm_weight_offset = mc.norm_weight_offset;
  c.sandwich_norms = mc.sandwich_norms;
  c.scale_embeddings = mc.scale_embeddings;
  c.activation = mc.activation == model::Activation::GeluTanh ? cuda::DecoderConfig::Activation::kGeluTanh
                                                               : cuda::DecoderConfig::Activation::kSiLU;
  c.o_bias = mc.o_bias;      // llama's attention_bias (with qkv_bias)
  c.mlp_bias = mc.mlp_bias;  // llama's mlp_bias
  return c;
}

// The training: LoRA placement and everything the recipe config asks of the step.
cuda::TrainingSetup map_setup(const RecipeConfig& cfg, const RecipeSpec& recipe, const model::ModelConfig& mc,
                              int64_t batch, int64_t seq_len, std::vector<std::string>& gaps) {
  cuda::TrainingSetup s;
  s.batch = batch;
  s.seq_len = seq_len;
  s.full_finetune = !recipe.lora;
  s.activation_checkpointing = cfg.enable_activation_checkpointing;  // one layer's activations, recomputed
  // The kept layer inputs to pinned host memory and back (the config schema refuses it without checkpointing).
  s.activation_offloading = cfg.enable_activation_offloading;
  if (cfg.dtype != TrainDtype::BF16) gaps.push_back("dtype=fp32: the GPU step trains in bf16 only (dtype=bf16)");
  if (!recipe.lora) return s;
  s.lora_rank = cfg.model.lora_rank;
  s.lora_alpha = float(cfg.model.lora_alpha);
  const model::LoraTargets targets{cfg.model.lora_attn_modules, cfg.model.apply_lora_to_mlp,
                                   cfg.model.apply_lora_to_output};
  for (const std::string& module : model::lora_target_modules(targets)) {
    // apply_lora_to_output: LoRA inside the fused loss (a tied head: attach_lora refuses it first, as on the CPU)
    if (module == "lm_head") {
      s.lora_on_output = true;
      continue;
    }
    bool known = false;
    for (int p = 0; p < cuda::kNumProjections; ++p)
      if (module == cuda::projection_name(p)) s.lora_on[p] = known = true;
    if (!known) gaps.push_back("LoRA on " + module);
  }
  s.quantize_base = cfg.model.quantize_base;  // QLoRA: NF4 bases (lm_head's if adapted), the CPU quantiser's codes
  // and, as the CPU recipe attaches model::FrozenNf4Adapter, the layers' unadapted projections' (torchtune's)
  s.quantize_unadapted = s.quantize_base && model::qlora_quantizes_unadapted(mc.family);
  s.lora_dropout = float(cfg.model.lora_dropout);  // the CPU adapters' mask function (lora_seed: the recipe's)
  s.use_dora = cfg.model.use_dora;  // PEFT's DoRA, the CPU adapter's math (magnitude uploaded by name; lm_head's too)
  return s;
}

}  // namespace

CudaStepPlan plan_cuda_step(const RecipeConfig& cfg, const RecipeSpec& recipe, const model::ModelConfig& mc,
                            int64_t batch, int64_t seq_len) {
  CudaStepPlan plan;
  plan.model = map_model(mc, plan.gaps);
  plan.setup = map_setup(cfg, recipe, mc, batch, seq_len, plan.gaps);
  return plan;
}

void shard_cuda_step(CudaStepPlan& plan, int world, int rank, bool shard_layer_weights, bool prefetch) {
  if (world <= 1) return;
  plan.setup.optimizer_shards = world;
  plan.setup.optimizer_shard = rank;
  plan.setup.shard_gradients = plan.setup.full_finetune;
  plan.setup.shard_weights = shard_layer_weights;
  plan.setup.prefetch_weights = prefetch;
}

std::string describe_gaps(const std::vector<std::string>& gaps) {
  std::string text = "the GPU step does not do";
  for (size_t i = 0; i < gaps.size(); ++i) text += (i ? "; " : " ") + gaps[i];
  return text + ". Set device=cpu to train this config on the CPU engine, which does all of it";
}

}  // namespace ktune::train
