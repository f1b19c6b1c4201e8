// make_cuda_trainer(): the GPU step as the plugin libktune_cuda_step.so (cuda_trainer.h).
// On any machine with the CUDA backend built: a missing plugin is refused naming its path, and the
// real one loads, its one symbol is found, and an error inside it (no GPU: cudaMalloc fails) comes
// back across the plugin boundary as a ktune::Error naming the CUDA call.
// With a GPU: a tiny Llama host model's loss on the GPU is the CPU engine's on the same bf16 weights
// (within bf16 activations), a step trains what it should (all of a full fine-tune, only LoRA under
// LoRA) and comes back into the host model, and the AdamW moments round-trip by name.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/adapters/lora_adapter.h"
#include "model/decoder.h"
#include "train/cuda_trainer.h"
#include "train/recipe_config.h"

namespace ktune::train {
namespace {

const std::string kPlugin = std::string(KTUNE_BINARY_DIR) + "/bin/" + kCudaStepPlugin;

#define SKIP_WITHOUT_BACKEND() \
  if (!cuda_backend_built()) GTEST_SKIP() << "this build has no CUDA backend (KTUNE_CUDA=OFF)"

// A tiny Llama (vocab 64, hidden 32, 2 layers, heads 4/2 of 8), bf16 weights, and its GPU plan for (2, 16).
struct TinyRun {
  std::unique_ptr<model::Decoder> host;
  std::vector<std::shared_ptr<model::LoraAdapter>> adapters;
  CudaStepPlan plan;
  std::vector<int32_t> tokens, labels;  // (2, 16)
};

TinyRun tiny_run(bool lora) {
  TinyRun r;
  model::ModelConfig mc = model::ModelConfig::llama_like(64, 32, 2, 4, 2, 48);
  r.host = std::make_unique<model::Decoder>(mc, /*seed=*/11, DType::BF16);
  const std::string recipe = lora ? "lora_finetune_single_device" : "full_finetune_single_device";
  RecipeConfig cfg = prepare_recipe_config(recipe, lora ? "tiny/lora_single_device" : "tiny/full_single_device",
                                           {"dtype=bf16"});
  if (lora) {
    model::LoraOptions options;
    options.rank = 4;
    options.alpha = 8;
    options.seed = 5;
    r.adapters = model::attach_lora(*r.host, model::LoraTargets{{"q_proj", "v_proj"}, true, false}, options);
    cfg.model.lora_rank = 4;
    cfg.model.lora_alpha = 8;
    cfg.model.lora_attn_modules = {"q_proj", "v_proj"};
    cfg.model.apply_lora_to_mlp = true;
    // B starts at zero (PEFT): give it values, so that the adapters shape the loss.
    for (auto& a : r.adapters)
      for (model::Parameter* p : a->parameters())
        for (int64_t i = 0; i < p->value.numel(); ++i) p->value.f32()[i] = 0.05f * std::sin(0.37f * float(i + 1));
  } else {
    r.host->set_trainable([](const std::string&) { return true; });
  }
  r.plan = plan_cuda_step(cfg, *find_recipe(recipe), mc, 2, 16);
  EXPECT_TRUE(r.plan.gaps.empty()) << describe_gaps(r.plan.gaps);
  for (int i = 0; i < 32; ++i) {
    r.tokens.push_back((i * 7 + 3) % 64);
    r.labels.push_back(i % 16 == 15 ? -100 : (i * 7 + 10) % 64);
  }
  return r;
}

TEST(CudaPlugin, AMissingPluginIsRefusedNamingItsPath) {
  SKIP_WITHOUT_BACKEND();
  setenv("KTUNE_CUDA_STEP_PLUGIN", "/nonexistent/libktune_cuda_step.so", 1);
  TinyRun r = tiny_run(false);
  try {
    make_cuda_trainer(r.host->parameters(), r.plan, 1);
    FAIL() << "a missing plugin loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/libktune_cuda_step.so"), std::string::npos) << e.what();
  }
}

TEST(CudaPlugin, WithoutAGpuThePluginLoadsAndItsCudaErrorComesBackAsAKtuneError) {
  SKIP_WITHOUT_BACKEND();
  if (cuda_devices_visible() > 0) GTEST_SKIP() << "a GPU is visible (the GPU cases below run instead)";
  setenv("KTUNE_CUDA_STEP_PLUGIN", kPlugin.c_str(), 1);
  TinyRun r = tiny_run(false);
  try {
    make_cuda_trainer(r.host->parameters(), r.plan, 1);
    FAIL() << "the GPU step was created without a GPU";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find("cannot load"), std::string::npos) << what;  // it loaded; the failure is CUDA's
    // "…/device_memory.cu:N: cudaMalloc(&data_, bytes): cudaErrorInsufficientDriver (…)" without a
    // driver; cudaErrorNoDevice with a driver and no GPU.
    EXPECT_NE(what.find(": cudaError"), std::string::npos) << what;
  }
}

// The GPU cases run the real plugin on a GPU, or, where env KTUNE_TEST_CUDA_STEP_PLUGIN names one
// (CTest's ktune_cuda_plugin_tests_emulated: the same step over the host emulator of the kernels,
// tests/kernels/cuda/emulator), that plugin without one.
#define SKIP_WITHOUT_GPU()                                                                          \
  SKIP_WITHOUT_BACKEND();                                                                           \
  if (const char* emulated = std::getenv("KTUNE_TEST_CUDA_STEP_PLUGIN"); emulated && *emulated) {   \
    setenv("KTUNE_CUDA_STEP_PLUGIN", emulated, 1);                                                  \
  } else {                                                                                          \
    if (cuda_devices_visible() < 1) GTEST_SKIP() << "no GPU visible: nothing to run";              \
    setenv("KTUNE_CUDA_STEP_PLUGIN", kPlugin.c_str(), 1);                                           \
  }

TEST(CudaPlugin, OnAGpuTheLossIsTheCpuEnginesOnTheSameBf16Weights) {
  SKIP_WITHOUT_GPU();
  for (bool lora : {false, true}) {
    TinyRun r = tiny_run(lora);
    std::unique_ptr<CudaTrainer> gpu = make_cuda_trainer(r.host->parameters(), r.plan, 1);
    const model::LossResult cpu = r.host->forward_loss(model::Batch{r.tokens.data(), r.labels.data(), nullptr, nullptr, 2, 16});
    const model::LossResult dev = gpu->forward_loss(FixedShapeBatch{2, 16, r.tokens, r.labels});
    EXPECT_EQ(dev.n_valid, cpu.n_valid);
    EXPECT_NEAR(dev.loss_sum / dev.n_valid, cpu.loss_sum / cpu.n_valid, 1e-2 * cpu.loss_sum / cpu.n_valid)
        << (lora ? "lora" : "full");
  }
}

// A step planned for (2, 16) takes a batch of (2, 8): the loss is the CPU engine's on those 8
// columns; a batch of (2, 17) is refused, naming the plan.
TEST(CudaPlugin, OnAGpuABatchShorterThanThePlanRunsAtItsOwnLength) {
  SKIP_WITHOUT_GPU();
  TinyRun r = tiny_run(true);
  std::unique_ptr<CudaTrainer> gpu = make_cuda_trainer(r.host->parameters(), r.plan, 1);
  std::vector<int32_t> tokens, labels;  // (2, 8): the first 8 columns of each row
  for (int b = 0; b < 2; ++b) {
    tokens.insert(tokens.end(), r.tokens.begin() + b * 16, r.tokens.begin() + b * 16 + 8);
    labels.insert(labels.end(), r.labels.begin() + b * 16, r.labels.begin() + b * 16 + 8);
  }
  const model::LossResult cpu = r.host->forward_loss(model::Batch{tokens.data(), labels.data(), nullptr, nullptr, 2, 8});
  const model::LossResult dev = gpu->forward_loss(FixedShapeBatch{2, 8, tokens, labels});
  EXPECT_EQ(dev.n_valid, cpu.n_valid);
  EXPECT_NEAR(dev.loss_sum / dev.n_valid, cpu.loss_sum / cpu.n_valid, 1e-2 * cpu.loss_sum / cpu.n_valid);
  gpu->zero_grad();
  EXPECT_EQ(gpu->forward_backward(FixedShapeBatch{2, 8, tokens, labels}, 1.0f).n_valid, cpu.n_valid);
  std::vector<int32_t> long_tokens(34, 1), long_labels(34, 2);
  try {
    gpu->forward_loss(FixedShapeBatch{2, 17, long_tokens, long_labels});
    FAIL() << "a (2, 17) batch for a step planned for (2, 16) was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("at most 16"), std::string::npos) << e.what();
  }
}

TEST(CudaPlugin, OnAGpuAStepTrainsWhatItShouldAndComesBackIntoTheHostModel) {
  SKIP_WITHOUT_GPU();
  for (bool lora : {false, true}) {
    TinyRun r = tiny_run(lora);
    std::unique_ptr<CudaTrainer> gpu = make_cuda_trainer(r.host->parameters(), r.plan, 1);
    std::vector<Tensor> before;
    for (model::Parameter* p : r.host->parameters()) before.push_back(p->value.to(DType::F32));
    gpu->zero_grad();
    const model::LossResult first = gpu->forward_backward(FixedShapeBatch{2, 16, r.tokens, r.labels}, 1.0f / 30);
    EXPECT_GT(gpu->clip_gradient_norm(INFINITY), 0.0);
    gpu->optimizer_step(1e-2, AdamWSettings{1e-2, 0.9, 0.999, 1e-8, 0.0});
    EXPECT_EQ(gpu->optimizer_steps(), 1);
    gpu->download_trainable();
    const std::vector<model::Parameter*> params = r.host->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      const Tensor now = params[i]->value.to(DType::F32);
      double moved = 0;
      for (int64_t j = 0; j < now.numel(); ++j) moved += std::fabs(now.f32()[j] - before[i].f32()[j]);
      if (params[i]->trainable)
        EXPECT_GT(moved, 0.0) << params[i]->name << " did not move";
      else
        EXPECT_EQ(moved, 0.0) << params[i]->name << " is frozen but moved";
    }
    // The moments by the CPU optimizer's names, back in as they came out.
    std::map<std::string, Tensor> state = gpu->optimizer_state();
    for (model::Parameter* p : params)
      if (p->trainable) {
        EXPECT_TRUE(state.count("exp_avg." + p->name) && state.count("exp_avg_sq." + p->name)) << p->name;
      }
    gpu->load_optimizer_state(state, 1, "test");
    std::map<std::string, Tensor> again = gpu->optimizer_state();
    for (const auto& [name, t] : state)
      for (int64_t j = 0; j < t.numel(); ++j) ASSERT_EQ(t.bf16()[j], again.at(name).bf16()[j]) << name;
    // And the loss fell.
    gpu->zero_grad();
    EXPECT_LT(gpu->forward_loss(FixedShapeBatch{2, 16, r.tokens, r.labels}).loss_sum, first.loss_sum);
  }
}

}  // namespace
}  // namespace ktune::train
