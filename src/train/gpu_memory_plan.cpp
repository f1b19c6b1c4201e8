// `ktune plan --device cuda` (gpu_memory_plan.h): the request as a recipe config, mapped and sharded
// as a run maps it, planned by the GPU step for each attention path, and printed.
#include "train/gpu_memory_plan.h"

#include <algorithm>
#include <cstdio>

#include "core/error.h"
#include "train/cuda_trainer.h"
#include "train/device_selection.h"
#include "train/recipe_registry.h"

namespace ktune::train {

namespace {

// What nvidia-smi reports as each GPU's memory (81559 MiB, 143771 MiB).
struct KnownGpu {
  const char* name;
  double gib;
};
constexpr KnownGpu kKnownGpus[] = {{"H100 80GB", 79.6}, {"H200", 140.4}};

std::string gib(size_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3f GiB", double(bytes) / double(1ull << 30));
  return text;
}

// The request as the recipe config a run would read (only what the GPU step's plan depends on).
CudaStepPlan plan_of(const GpuMemoryPlanRequest& r, int world) {
  const ShardingPlanRequest& shared = r.shared;
  const bool lora = shared.lora || r.quantize_base || r.use_dora;
  RecipeConfig cfg;
  cfg.dtype = TrainDtype::BF16;
  cfg.enable_activation_checkpointing = r.activation_checkpointing;
  cfg.enable_activation_offloading = r.activation_offloading;
  cfg.fsdp_reshard_after_forward = shared.reshard_after_forward;
  cfg.model.lora = lora;
  cfg.model.lora_rank = int(shared.lora_rank);
  cfg.model.lora_alpha = 2.0 * double(shared.lora_rank);  // no bearing on memory
  cfg.model.lora_attn_modules = shared.lora_attn_modules;
  cfg.model.apply_lora_to_mlp = shared.apply_lora_to_mlp;
  cfg.model.apply_lora_to_output = r.apply_lora_to_output;
  cfg.model.quantize_base = r.quantize_base;
  cfg.model.use_dora = r.use_dora;
  RecipeSpec recipe;  // plan_cuda_step reads whether it trains LoRA; the sharding follows below
  recipe.lora = lora;
  CudaStepPlan plan = plan_cuda_step(cfg, recipe, shared.model, r.batch_size, r.max_seq_len);
  if (!plan.gaps.empty()) throw Error("ktune plan --device cuda", describe_gaps(plan.gaps));
  if (shared.sharded) shard_cuda_step(plan, world, 0, shared.reshard_after_forward, /*prefetch=*/true);
  return plan;
}

std::string sharding_of(const cuda::TrainingSetup& s, int world) {
  if (world <= 1) return "one GPU";
  if (s.optimizer_shards <= 1) return std::to_string(world) + " GPUs, each a replica (gradients all-reduced)";
  std::string text = std::to_string(world) + " GPUs: the AdamW state sharded";
  if (s.shard_gradients) text += ", the gradients (ZeRO-2)";
  if (s.shard_weights)
    text += s.full_finetune ? ", the layers' weights (ZeRO-3)" : ", the layers' frozen base (ZeRO-3)";
  return text + "; the embedding and the head whole";
}

}  // namespace

std::string format_gpu_memory_plan(const GpuMemoryPlanRequest& r) {
  check(r.batch_size >= 1 && r.max_seq_len >= 1, "ktune plan --device cuda",
        "--batch_size and --max_seq_len must be >= 1");
  check(!r.activation_offloading || r.activation_checkpointing, "ktune plan --activation_offloading",
        "offloading moves the layer inputs that activation checkpointing keeps: add --activation_checkpointing");
  const int world = r.shared.nnodes * r.shared.nproc_per_node;
  CudaStepPlan plan = plan_of(r, world);
  using A = cuda::TrainingSetup::Attention;
  struct Path {
    A kernel;
    const char* name;
    cuda::Decoder::MemoryPlan memory;
  };
  std::vector<Path> paths = {{A::kGemm, "gemm", {}}, {A::kTensorCore, "tensor_core", {}}, {A::kFlash, "flash", {}}};
  for (Path& p : paths) {
    plan.setup.attention = p.kernel;
    p.memory = plan_cuda_memory(plan);
  }
  const Path& most = *std::max_element(paths.begin(), paths.end(), [](const Path& a, const Path& b) {
    return a.memory.total() < b.memory.total();
  });
  const cuda::Decoder::MemoryPlan& m = most.memory;
  const cuda::TrainingSetup& s = plan.setup;
  std::string out;
  auto add = [&](const std::string& line) { out += line + "\n"; };
  std::string recipe = s.full_finetune ? "full" : s.quantize_base ? "QLoRA" : s.use_dora ? "DoRA" : "LoRA";
  if (!s.full_finetune) recipe += " rank " + std::to_string(s.lora_rank);
  add("GPU step (device=cuda), per GPU as a run allocates it (cuda::Decoder::plan): " + recipe + ", batch " +
      std::to_string(s.batch) + " x " + std::to_string(s.seq_len) + ", activation checkpointing " +
      (s.activation_checkpointing ? "on" : "off") + (s.activation_offloading ? " with offloading" : "") +
      "; bf16 weights, activations and AdamW moments, f32 gradients");
  add("world: " + sharding_of(s, world));
  std::string parts;  // the parameters' notable parts, those there are
  auto part = [&](const char* what, size_t bytes) {
    if (bytes) parts += std::string(parts.empty() ? " (" : ", ") + what + " " + gib(bytes);
  };
  part(s.shard_weights ? "NF4 codes and scales held whole" : "NF4 codes and scales", m.nf4_base);
  part("this GPU's layer pieces", m.weight_pieces);
  part("weight slots", m.weight_slots);
  add("  parameters   " + gib(m.parameters) + parts + (parts.empty() ? "" : ")"));
  std::string grads = "  gradients    " + gib(m.gradients);
  if (s.shard_gradients)
    grads += " (this GPU's accumulators " + gib(m.grad_accumulators) + ", two layer slots " +
             gib(m.grad_layer_slots) + ", the embedding's and head's " + gib(m.grad_whole_units) + ")";
  add(grads);
  add("  AdamW state  " + gib(m.optimizer));
  add("  activations  " + gib(m.activations) + " (the loss's scratch " + gib(m.loss_scratch) + ", " +
      gib(m.loss_overlaid) + " of it over buffers the loss leaves idle" +
      (m.nf4_scratch ? ", NF4 dequantisation " + gib(m.nf4_scratch) : std::string()) + ")");
  std::string totals;
  for (const Path& p : paths) totals += std::string(totals.empty() ? "" : ", ") + p.name + " " + gib(p.memory.total());
  add("  total        " + gib(m.total()) + " with the " + most.name + " attention path, the most of the three (" +
      totals + "; a run's auto choice takes the fastest on its GPU)");
  if (m.host_offload) add("  pinned host  " + gib(m.host_offload) + " (activation offloading, host memory)");
  // As a run refuses a plan: the arenas and the margin it keeps free beside them.
  const double need = double(m.total() + cuda::Decoder::kFreeMemoryMargin) / double(1ull << 30);
  std::string fits = "fits (the total and " + std::to_string(cuda::Decoder::kFreeMemoryMargin >> 20) +
                     " MiB kept free; the CUDA context's few hundred MiB not counted):";
  for (const KnownGpu& g : kKnownGpus) {
    char part[96];
    std::snprintf(part, sizeof part, " %s (%.1f GiB) %s%s", g.name, g.gib, need <= g.gib ? "yes" : "no",
                  &g == &kKnownGpus[0] ? ";" : "");
    fits += part;
  }
  add(fits);
  return out;
}

}  // namespace ktune::train
