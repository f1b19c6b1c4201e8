// make_cuda_trainer(): the GPU step as the plugin libktune_cuda_step.so (cuda_trainer.h).
// On any machine with the CUDA backend built: a missing plugin is refused naming its path, and the
// real one loads, its one symbol is found, and an error inside it (no GPU: cudaMalloc fails) comes
// back across the plugin boundary as a ktune::Error naming the CUDA call.
// With a GPU: a tiny Llama host model's loss on the GPU is the CPU engine's on the same bf16 weights
// (within bf16 activations), a step trains what it should (all of a full fine-tune, only LoRA under
// LoRA) and comes back into the host model, and the AdamW moments round-trip by name; with LoRA on
// lm_head (and QLoRA's NF4 lm_head) the loss and the gradient norm are the CPU engine's.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "dist/process_group.h"
#include "dist/tcp_store.h"
#include "io/safetensors.h"
#include "model/adapters/lora_adapter.h"
#include "model/decoder.h"
#include "train/cuda_trainer.h"
#include "train/recipe_config.h"

namespace ktune::train {
namespace {

const std::string kPlugin = std::string(KTUNE_BINARY_DIR) + "/bin/" + kCudaStepPlugin;

#define SKIP_WITHOUT_BACKEND() \
  if (!cuda_backend_built()) GTEST_SKIP() << "this build has no CUDA backend (KTUNE_CUDA=OFF)"

// A tiny Llama (vocab 64, hidden 32, 2 layers unless `layers` says, heads 4/2 of 8), bf16 weights, and
// its GPU plan for (2, 16).
struct TinyRun {
  std::unique_ptr<model::Decoder> host;
  std::vector<std::shared_ptr<model::LoraAdapter>> adapters;
  CudaStepPlan plan;
  std::vector<int32_t> tokens, labels;  // (2, 16)
};

// head_lora: LoRA on lm_head too (apply_lora_to_output; the head untied); qlora: NF4 bases;
// tied: the head tied to the embedding (llama_like's is untied); dora: DoRA on every adapter (lm_head's too).
TinyRun tiny_run(bool lora, bool head_lora = false, bool qlora = false, bool tied = false, bool dora = false,
                 int64_t layers = 2) {
  TinyRun r;
  model::ModelConfig mc = model::ModelConfig::llama_like(64, 32, layers, 4, 2, 48);
  if (tied) mc.tie_word_embeddings = true;
  if (head_lora) mc.tie_word_embeddings = false;
  // (QLoRA's and DoRA's host model is f32, as the recipe loads it: the CPU adapter quantises f32 bases,
  // and DoRA's bases stay f32)
  r.host = std::make_unique<model::Decoder>(mc, /*seed=*/11, qlora || dora ? DType::F32 : DType::BF16);
  const std::string recipe = lora ? "lora_finetune_single_device" : "full_finetune_single_device";
  RecipeConfig cfg = prepare_recipe_config(recipe, lora ? "tiny/lora_single_device" : "tiny/full_single_device",
                                           {"dtype=bf16"});
  if (lora) {
    model::LoraOptions options;
    options.rank = 4;
    options.alpha = 8;
    options.seed = 5;
    options.quantize_base = qlora;
    options.use_dora = dora;
    r.adapters = model::attach_lora(*r.host, model::LoraTargets{{"q_proj", "v_proj"}, true, head_lora}, options);
    cfg.model.lora_rank = 4;
    cfg.model.lora_alpha = 8;
    cfg.model.lora_attn_modules = {"q_proj", "v_proj"};
    cfg.model.apply_lora_to_mlp = true;
    cfg.model.apply_lora_to_output = head_lora;
    cfg.model.quantize_base = qlora;
    cfg.model.use_dora = dora;
    // B starts at zero (PEFT): give it values, so that the adapters shape the loss (DoRA's magnitude
    // keeps its start, the row norms of W, so that c = m / ‖W + s B A‖ moves away from 1 with B).
    for (auto& a : r.adapters)
      for (model::Parameter* p : a->parameters())
        if (p->name.find("lora_magnitude_vector") == std::string::npos)
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
  unsetenv("KTUNE_CUDA_STEP_PLUGIN");  // the tests after this one in the same process load the real one
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

// A host parameter's value as the GPU takes it: a QLoRA base, which this CPU model's adapter holds as
// NF4, dequantised; any other a copy of its value, f32.
Tensor host_value(TinyRun& r, const model::Parameter& p) {
  for (const auto& a : r.adapters) {
    const model::Linear& base = r.host->linear(a->module_name());
    if (base.weight->name == p.name && a->options().quantize_base) return a->base_weight(base);
  }
  return p.value.to(DType::F32);
}

// How the GPU step reads the host parameters (cuda_trainer.h's HostReader): host_value's elements.
HostReader host_values(TinyRun& r) {
  return [&r](const model::Parameter& p, int64_t first, int64_t count, float* out) {
    const Tensor value = host_value(r, p);
    std::copy(value.f32() + first, value.f32() + first + count, out);
  };
}

// √(Σ g²) over the host model's trainable gradients.
double host_gradient_norm(model::Decoder& host) {
  double sum = 0;
  for (model::Parameter* p : host.parameters()) {
    if (!p->trainable) continue;
    const Tensor g = p->grad.to(DType::F32);
    for (int64_t i = 0; i < g.numel(); ++i) sum += double(g.f32()[i]) * g.f32()[i];
  }
  return std::sqrt(sum);
}

// LoRA on lm_head (apply_lora_to_output, an untied head), with and without QLoRA (lm_head's base NF4
// on both sides: uploaded dequantised, quantised again into the same codes), and with DoRA (lm_head's
// magnitude uploaded by name): the GPU's loss and its gradient norm are the CPU engine's, and a step
// moves lm_head's A and B (and m) and leaves its W.
TEST(CudaPlugin, OnAGpuLoraOnTheOutputProjectionIsTheCpuEngines) {
  SKIP_WITHOUT_GPU();
  for (bool dora : {false, true})
  for (bool qlora : {false, true}) {
    const std::string what = std::string(qlora ? "qlora" : "lora") + (dora ? "+dora" : "") + " + lm_head";
    TinyRun r = tiny_run(true, true, qlora, false, dora);
    ASSERT_TRUE(r.plan.setup.lora_on_output && r.plan.setup.use_dora == dora);
    // lm_head's B of O(1), so that s (h Aᵀ) Bᵀ moves the logits by O(1) (tiny_run's 0.05 barely would)
    Tensor& head_b = r.host->parameter("base_model.model.lm_head.lora_B.weight").value;
    for (int64_t i = 0; i < head_b.numel(); ++i) head_b.f32()[i] = std::sin(0.37f * float(i + 1));
    std::unique_ptr<CudaTrainer> gpu = make_cuda_trainer(r.host->parameters(), r.plan, 1, host_values(r));
    const model::Batch batch{r.tokens.data(), r.labels.data(), nullptr, nullptr, 2, 16};
    const model::LossResult cpu_loss = r.host->forward_loss(batch);
    const model::LossResult dev_loss = gpu->forward_loss(FixedShapeBatch{2, 16, r.tokens, r.labels});
    EXPECT_EQ(dev_loss.n_valid, cpu_loss.n_valid) << what;
    EXPECT_NEAR(dev_loss.loss_sum, cpu_loss.loss_sum, 1e-2 * cpu_loss.loss_sum) << what;
    r.host->zero_grad();
    r.host->forward_backward(batch, 1.0f / 30);
    const double cpu_norm = host_gradient_norm(*r.host);
    gpu->zero_grad();
    gpu->forward_backward(FixedShapeBatch{2, 16, r.tokens, r.labels}, 1.0f / 30);
    const double dev_norm = gpu->clip_gradient_norm(INFINITY);
    EXPECT_NEAR(dev_norm, cpu_norm, 0.03 * cpu_norm) << what << ": gradient norm";
    std::vector<std::string> names = {"lm_head.weight", "base_model.model.lm_head.lora_A.weight",
                                      "base_model.model.lm_head.lora_B.weight"};
    if (dora) names.push_back("base_model.model.lm_head.lora_magnitude_vector");
    std::vector<Tensor> before;
    for (const std::string& n : names) before.push_back(host_value(r, r.host->parameter(n)));
    gpu->optimizer_step(1e-2, AdamWSettings{1e-2, 0.9, 0.999, 1e-8, 0.0});
    gpu->download_trainable();
    for (size_t i = 0; i < names.size(); ++i) {
      const Tensor now = host_value(r, r.host->parameter(names[i]));
      double moved = 0;
      for (int64_t j = 0; j < now.numel(); ++j) moved += std::fabs(now.f32()[j] - before[i].f32()[j]);
      EXPECT_EQ(moved > 0, i > 0) << what << ": " << names[i] << (i > 0 ? " did not move" : " is frozen but moved");
    }
  }
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

// ---- Data parallelism on the GPU step, W ranks as W processes ----
// Only over the emulated step (KTUNE_TEST_CUDA_STEP_PLUGIN): the ranks' group is the plugin's own,
// the real NCCL process group (over the emulator's fake NCCL there: each rank process its own
// emulated device), as the recipe makes it. On GPUs this needs one GPU a rank, which one-GPU
// machines lack: the recipes' two-GPU runs (cuda_recipe_test.cpp) are the GPU check.

// A different (2, 16) batch per rank r: tokens and labels shifted by r.
FixedShapeBatch rank_batch(const TinyRun& r, int rank) {
  FixedShapeBatch b{2, 16, r.tokens, r.labels};
  for (size_t i = 0; i < b.tokens.size(); ++i) {
    b.tokens[i] = (b.tokens[i] + 5 * rank) % 64;
    if (b.labels[i] >= 0) b.labels[i] = (b.labels[i] + 3 * rank) % 64;
  }
  return b;
}

// The bf16 bits of every trainable parameter and moment after `steps` steps, by name.
using Bits = std::map<std::string, std::vector<uint16_t>>;
void add_bits(Bits& bits, const std::string& name, const Tensor& t) {
  const Tensor narrow = t.dtype() == DType::BF16 ? t : t.to(DType::BF16);
  bits[name] = std::vector<uint16_t>(narrow.bf16(), narrow.bf16() + narrow.numel());
}

// One optimizer step of the world's batches, `micro` micro-batches a rank: one GPU accumulates all
// W * micro (the reference), or rank r runs its own and the group does the rest. Returns the norm
// before clipping.
double train_step(CudaTrainer& gpu, const TinyRun& r, int world, int rank, bool distributed, int step, int micro) {
  gpu.zero_grad();
  for (int j = 0; j < micro; ++j)
    for (int k = 0; k < world; ++k)
      if (!distributed || k == rank) gpu.forward_backward(rank_batch(r, k + world * (j + micro * step)), 1.0f / 90);
  gpu.reduce_gradients();
  const double norm = gpu.clip_gradient_norm(0.02);  // small enough to clip
  gpu.optimizer_step(1e-2, AdamWSettings{1e-2, 0.9, 0.999, 1e-8, 0.01});
  return norm;
}

// How the sharded run is set up: LoRA (ZeRO-1) or a full fine-tune with its gradients sharded too
// (ZeRO-2) and, with weights, its layers' weights (ZeRO-3; LoRA: its layers' frozen base),
// micro-batches a rank and a step, an untied or tied head, QLoRA (NF4 bases, their codes and scales
// sharded with the rest), the model's layers.
struct ShardedCase {
  bool lora = false;
  int micro = 1;
  bool tied = false;
  bool weights = false;
  bool qlora = false;
  int64_t layers = 2;
};

// The moments streamed as a save writes them (stream_optimizer_state), on every rank at once: rank 0
// plans every moment of `whole` and the others nothing; a save that stops after its first tensor
// (finish_optimizer_state runs the gathers it did not reach) leaves the GPUs in step, so a second
// stream produces, in order, every moment equal to `whole`'s; a tensor produced after a later one's
// gather ran is refused.
void expect_streamed_moments(CudaTrainer& many, int rank, const std::map<std::string, Tensor>& whole) {
  std::vector<io::PlannedTensor> planned = many.stream_optimizer_state(/*keep=*/rank == 0);
  EXPECT_EQ(planned.size(), whole.size());
  if (!planned.empty()) planned.front().produce();
  many.finish_optimizer_state();
  planned = many.stream_optimizer_state(/*keep=*/rank == 0);
  ASSERT_EQ(planned.size(), whole.size());
  for (const io::PlannedTensor& t : planned) {
    const Tensor produced = t.produce();
    ASSERT_TRUE(whole.count(t.name)) << t.name;
    const Tensor& want = whole.at(t.name);
    ASSERT_EQ(produced.dtype(), DType::BF16) << t.name;
    ASSERT_EQ(produced.shape(), want.shape()) << t.name;
    EXPECT_EQ(std::memcmp(produced.raw(), want.raw(), want.bytes()), 0) << t.name << " streamed differs from whole";
  }
  if (planned.size() > 1) {
    EXPECT_THROW(planned.front().produce(), Error);
  }
  many.finish_optimizer_state();
}

// The trained values streamed as a save writes them (stream_trainable), on every rank at once, after
// download_trainable brought them into `host`: rank 0's sink gets each trainable value once, f32, its
// host value's bits; the other ranks take part with no sink. A sink that throws at its first tensor
// (a full disk) leaves the GPUs in step: rank 0 still runs the remaining gathers (ZeRO-3's layers)
// before the error comes back, so a second stream on every rank completes and sees them all again.
void expect_streamed_values(CudaTrainer& many, int rank, model::Decoder& host) {
  std::map<std::string, const model::Parameter*> want;
  for (const model::Parameter* p : host.parameters())
    if (p->trainable) want[p->name] = p;
  if (rank == 0) {
    try {
      many.stream_trainable([](const std::string& name, const Tensor&) { throw Error(name, "No space left on device"); });
      ADD_FAILURE() << "the sink's error did not come back";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("No space left on device"), std::string::npos) << e.what();
    }
  } else {
    many.stream_trainable(io::TensorSink());
  }
  std::map<std::string, int> seen;
  many.stream_trainable(rank != 0 ? io::TensorSink() : [&](const std::string& name, const Tensor& values) {
    ++seen[name];
    ASSERT_TRUE(want.count(name)) << name << " is not a trainable parameter";
    const Tensor& value = want.at(name)->value;
    ASSERT_EQ(values.dtype(), DType::F32) << name;
    ASSERT_EQ(values.shape(), value.shape()) << name;
    const Tensor narrowed = values.to(value.dtype());
    EXPECT_EQ(std::memcmp(narrowed.raw(), value.raw(), value.bytes()), 0) << name << " streamed differs from downloaded";
  });
  if (rank != 0) return;
  EXPECT_EQ(seen.size(), want.size());
  for (const auto& [name, n] : seen) EXPECT_EQ(n, 1) << name;
}

// In each rank's process: the sharded run and the one-GPU reference, three steps each with a
// reload of the reference's moments before the third; writes what it saw to `out` (name, then the
// bits: "value.<name>" after the steps, "state.<name>" from rank 0's gathered moments) and the norms.
void sharded_rank(int world, int rank, int port, const ShardedCase& how, const std::string& out) {
  dist::TcpStore store("127.0.0.1", port, std::chrono::seconds(60));
  auto group = make_gpu_process_group(store, "gpu", rank, world, std::chrono::seconds(60));
  const bool lora = how.lora;
  TinyRun ref = tiny_run(lora, false, how.qlora, how.tied, false, how.layers);
  TinyRun shard = tiny_run(lora, false, how.qlora, how.tied, false, how.layers);
  shard.plan.setup.optimizer_shards = world;
  shard.plan.setup.optimizer_shard = rank;
  shard.plan.setup.shard_gradients = !lora;  // as the recipe sets it
  shard.plan.setup.shard_weights = how.weights;
  std::unique_ptr<CudaTrainer> one = make_cuda_trainer(ref.host->parameters(), ref.plan, 1, host_values(ref));
  std::unique_ptr<CudaTrainer> many =
      make_cuda_trainer(shard.host->parameters(), shard.plan, 1, host_values(shard), group.get());
  EXPECT_EQ(many->memory_report().find("gradients sharded (ZeRO-2)") != std::string::npos, !lora) << many->memory_report();
  EXPECT_EQ(many->memory_report().find("weights sharded (ZeRO-3)") != std::string::npos, how.weights)
      << many->memory_report();
  EXPECT_EQ(many->memory_report().find("frozen bf16 base weights") != std::string::npos, how.weights && lora)
      << many->memory_report();
  EXPECT_EQ(many->memory_report().find("base weights and NF4 codes and scales") != std::string::npos,
            how.weights && how.qlora)
      << many->memory_report();
  std::ofstream os(out);
  for (int step = 0; step < 3; ++step) {
    if (step == 2) {  // a resume: the reference's moments, whole, into every rank's shard
      const std::map<std::string, Tensor> state = one->optimizer_state();
      many->load_optimizer_state(state, one->optimizer_steps(), "test");
    }
    const double a = train_step(*one, ref, world, rank, false, step, how.micro);
    const double b = train_step(*many, shard, world, rank, true, step, how.micro);
    os << "norm " << step << " " << a << " " << b << "\n";
  }
  Bits bits;
  const std::map<std::string, Tensor> want = one->optimizer_state(), got = many->optimizer_state(/*keep=*/rank == 0);
  EXPECT_EQ(got.empty(), rank != 0);
  expect_streamed_moments(*many, rank, got);
  one->download_trainable();
  many->download_trainable();
  expect_streamed_values(*many, rank, *shard.host);
  const std::vector<model::Parameter*> ref_params = ref.host->parameters(), shard_params = shard.host->parameters();
  for (size_t i = 0; i < ref_params.size(); ++i) {
    if (!ref_params[i]->trainable) continue;
    add_bits(bits, "want.value." + ref_params[i]->name, ref_params[i]->value);
    add_bits(bits, "got.value." + shard_params[i]->name, shard_params[i]->value);
  }
  for (const auto& [name, t] : want) add_bits(bits, "want.state." + name, t);
  for (const auto& [name, t] : got) add_bits(bits, "got.state." + name, t);
  for (const auto& [name, v] : bits) {
    os << name << " " << v.size();
    for (uint16_t h : v) os << " " << h;
    os << "\n";
  }
}

int bf16_ulps(uint16_t a, uint16_t b) {
  auto line = [](uint16_t h) { return (h & 0x8000) ? -int(h & 0x7fff) : int(h); };
  return std::abs(line(a) - line(b));
}

// W ranks, sharded, against one GPU that accumulates all W batches: the same weights and moments
// (the f32 sums of the gradients may associate differently, and a stochastic rounding then differ by
// one bf16 step), the same gradient norm, every rank the same weights bit for bit; rank 0 gets the
// whole moments, a reload into the shards resumes the same.
void expect_sharded_equals_one_gpu(int world, const ShardedCase& how) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("ktune_sharded_gpu_" + std::to_string(getpid()) + "_" + std::to_string(world));
  std::filesystem::create_directories(dir);
  dist::TcpStoreServer server(0);
  std::vector<pid_t> children;
  for (int rank = 0; rank < world; ++rank) {
    const pid_t pid = fork();
    if (pid == 0) {
      int code = 0;
      try {
        sharded_rank(world, rank, server.port(), how, (dir / ("rank" + std::to_string(rank))).string());
        code = ::testing::Test::HasFailure() ? 1 : 0;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
        code = 2;
      }
      std::fflush(nullptr);
      _exit(code);
    }
    children.push_back(pid);
  }
  for (int rank = 0; rank < world; ++rank) {
    int status = 0;
    waitpid(children[size_t(rank)], &status, 0);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "rank " << rank << " failed (status " << status << ")";
  }
  std::vector<Bits> seen(static_cast<size_t>(world));
  for (int rank = 0; rank < world; ++rank) {
    std::ifstream is(dir / ("rank" + std::to_string(rank)));
    std::string line;
    while (std::getline(is, line)) {
      std::istringstream ls(line);
      std::string name;
      ls >> name;
      if (name == "norm") {
        int step = 0;
        double a = 0, b = 0;
        ls >> step >> a >> b;
        EXPECT_GT(a, 0.02) << "the clip never clipped";
        EXPECT_NEAR(b, a, 1e-6 * a) << "rank " << rank << " step " << step << ": the sharded norm";
        continue;
      }
      size_t n = 0;
      ls >> n;
      std::vector<uint16_t> v(n);
      for (auto& h : v) ls >> h;
      seen[size_t(rank)][name] = v;
    }
  }
  int64_t compared = 0, identical = 0;
  for (const auto& [name, want] : seen[0]) {
    if (name.rfind("want.", 0) != 0) continue;
    const std::string got_name = "got." + name.substr(5);
    ASSERT_TRUE(seen[0].count(got_name)) << got_name << " missing on rank 0";
    const std::vector<uint16_t>& got = seen[0].at(got_name);
    ASSERT_EQ(got.size(), want.size()) << name;
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_LE(bf16_ulps(got[i], want[i]), 1) << got_name << "[" << i << "] against one GPU's";
      identical += got[i] == want[i];
      ++compared;
    }
    if (name.rfind("want.value.", 0) == 0) {
      for (int rank = 1; rank < world; ++rank)
        EXPECT_EQ(seen[size_t(rank)].at(got_name), got) << got_name << " on rank " << rank << " is not rank 0's";
    }
  }
  std::printf("%d ranks: %lld of %lld weights and moments bit-identical to one GPU's\n", world, (long long)identical,
              (long long)compared);
  EXPECT_GT(compared, 0);
  // Two ranks sum two gradients, which commutes: only the clip factor's double sums associate
  // differently (a last-bit change that rarely survives the narrowing to f32), so bit for bit; that
  // catches a shard that draws other random bits than the whole tensor's step.
  if (world == 2) {
    EXPECT_EQ(identical, compared);
  }
  EXPECT_GE(identical, compared * 99 / 100) << identical << " of " << compared << " bit-identical";
  for (int rank = 1; rank < world; ++rank)
    for (const auto& [name, v] : seen[size_t(rank)]) EXPECT_NE(name.rfind("got.state.", 0), 0u) << name << " on rank " << rank;
  std::filesystem::remove_all(dir);
}

#define SKIP_WITHOUT_EMULATED_STEP()                                                                   \
  SKIP_WITHOUT_BACKEND();                                                                              \
  if (const char* emulated = std::getenv("KTUNE_TEST_CUDA_STEP_PLUGIN"); emulated && *emulated) {      \
    setenv("KTUNE_CUDA_STEP_PLUGIN", emulated, 1);                                                     \
  } else {                                                                                             \
    GTEST_SKIP() << "needs the emulated GPU step (a device a rank; GPUs run the recipes' two-GPU tests)"; \
  }

// ZeRO-2: the gradients reduce-scattered unit by unit as the backward goes, accumulated over two
// micro-batches a rank; the head untied (lm_head in the top unit with the final norm) and tied (the
// embedding's unit takes the loss's head gradient too).
TEST(CudaPlugin, OnAGpuShardedAdamWOverTwoRanksEqualsOneGpuFullFinetune) {
  SKIP_WITHOUT_EMULATED_STEP();
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied head" : "untied head");
    expect_sharded_equals_one_gpu(2, ShardedCase{/*lora=*/false, /*micro=*/2, tied});
  }
}

// ZeRO-3: each rank holds and steps its pieces of the layers' weights, gathered before each layer's
// forward and backward; the checkpoint's download gathers them on every rank. Two ranks, bit for bit
// (values and moments, clipped, moments reloaded); tied and untied. Two micro-batches each on two
// layers; one on three layers, more than the decoder's two weight slots, so that a layer's gather is
// never skipped for being in its slot still: a rank that gathered fewer layers than the other (a
// stream of the trained values left early when its sink threw, expect_streamed_values) leaves that
// one waiting. (Not both: two micro-batches a rank sum four gradients in another order than one GPU
// does, (g0 + g1) + (g2 + g3), and on three layers a stochastic rounding flips by one bf16 step once
// in a while, which the next steps' gradients carry on.)
TEST(CudaPlugin, OnAGpuShardedAdamWOverTwoRanksEqualsOneGpuFullFinetuneWeightsSharded) {
  SKIP_WITHOUT_EMULATED_STEP();
  for (bool tied : {false, true})
    for (const auto& [micro, layers] : {std::pair{2, int64_t(2)}, std::pair{1, int64_t(3)}}) {
      SCOPED_TRACE(std::string(tied ? "tied head, " : "untied head, ") + std::to_string(layers) + " layers");
      expect_sharded_equals_one_gpu(2, ShardedCase{/*lora=*/false, micro, tied, /*weights=*/true,
                                                   /*qlora=*/false, layers});
    }
}

// ZeRO-1 (LoRA keeps one gradient buffer): two ranks, two micro-batches each, bit for bit; three ranks.
TEST(CudaPlugin, OnAGpuShardedAdamWOverTwoRanksEqualsOneGpuLora) {
  SKIP_WITHOUT_EMULATED_STEP();
  expect_sharded_equals_one_gpu(2, ShardedCase{/*lora=*/true, /*micro=*/2});
}

// LoRA with its layers' frozen base sharded too (ZeRO-3 of the base): each rank stores its piece of
// each layer's frozen weights, gathered before the layer's forward and backward; the adapters (and
// their moments) equal one GPU's bit for bit, two ranks of two micro-batches each; and QLoRA (the
// NF4 bases' codes and scales sharded and gathered with the norms and any unadapted projection).
TEST(CudaPlugin, OnAGpuShardedAdamWOverTwoRanksEqualsOneGpuLoraBaseSharded) {
  SKIP_WITHOUT_EMULATED_STEP();
  for (bool qlora : {false, true}) {
    SCOPED_TRACE(qlora ? "qlora" : "lora");
    expect_sharded_equals_one_gpu(2, ShardedCase{/*lora=*/true, /*micro=*/2, /*tied=*/false, /*weights=*/true, qlora});
  }
}

TEST(CudaPlugin, OnAGpuShardedAdamWOverThreeRanksEqualsOneGpuLora) {
  SKIP_WITHOUT_EMULATED_STEP();
  expect_sharded_equals_one_gpu(3, ShardedCase{/*lora=*/true});
}

// A plan sharded for a group it is not given is refused before anything trains.
TEST(CudaPlugin, OnAGpuAShardedPlanWithoutItsGroupIsRefused) {
  SKIP_WITHOUT_EMULATED_STEP();
  TinyRun r = tiny_run(false);
  r.plan.setup.optimizer_shards = 2;
  try {
    make_cuda_trainer(r.host->parameters(), r.plan, 1);
    FAIL() << "a sharded plan ran without its group";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("shard 0 of 2"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ktune::train
