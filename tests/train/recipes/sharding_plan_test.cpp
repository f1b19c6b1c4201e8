// The scaling model (train/sharding_plan.h) on a case small enough to compute by hand, and against
// what ShardedDataParallel actually holds for a real decoder.
#include <gtest/gtest.h>

#include "core/error.h"
#include "dist/process_group.h"
#include "model/adapters/lora_adapter.h"
#include "model/decoder.h"
#include "train/sharded_data_parallel.h"
#include "train/sharding_plan.h"

using namespace ktune;
using namespace ktune::train;

namespace {
// vocab 10, hidden 4, 2 layers, 2 heads of 2 (q_dim 4), 1 kv head (kv_dim 2), intermediate 6, untied.
// A layer: q 16, k 8, v 8, o 16, gate 24, up 24, down 24, two norms 4 + 4 = 128; the root: embed 40,
// norm 4, lm_head 40 = 84; 340 in all.
ShardingPlanRequest hand_case() {
  ShardingPlanRequest r;
  r.model = model::ModelConfig::llama_like(10, 4, 2, 2, 1, 6);
  r.nnodes = 1;
  r.nproc_per_node = 2;
  r.bytes_per_value = 4;
  return r;
}
}  // namespace

TEST(ShardingPlan, FullFinetuneOnTwoRanksMatchesTheHandComputedFigures) {
  ShardingPlanRequest r = hand_case();
  ShardingPlan p = plan_sharding(r);
  EXPECT_EQ(p.total_params, 340);
  EXPECT_EQ(r.model.num_parameters(), 340);
  EXPECT_EQ(p.trainable_params, 340);
  // Layer unit: sizes rounded to 16 floats: 16+16+16+16+32+32+32+16+16 = 192 (a multiple of 32): shard 96.
  // Root unit: 48 + 16 + 48 = 112 → 128: shard 64. Per rank 96 + 96 + 64 = 256 floats.
  EXPECT_EQ(p.params, 256 * 4);
  EXPECT_EQ(p.gradients, 256 * 4);
  EXPECT_EQ(p.optimizer, 2 * 256 * 4);
  EXPECT_EQ(p.persistent(), 4096);
  EXPECT_EQ(p.replicated_persistent, 16 * 340);
  // Gathered: root values + grads (2 · 128) and one layer's values + grads (2 · 192), f32.
  EXPECT_EQ(p.gathered_peak, (2 * 128 + 2 * 192) * 4);
  // Sent: all-gather (W-1)·shard per unit, twice for the layers (forward, backward); reduce-scatter once.
  EXPECT_EQ(p.all_gather_sent, (2 * 2 * 96 + 64) * 4);
  EXPECT_EQ(p.reduce_scatter_sent, 256 * 4);
  EXPECT_EQ(p.all_reduce_sent, 0);

  r.reshard_after_forward = false;  // layers gathered once; all of them held until their backward
  r.gradient_accumulation_steps = 3;
  p = plan_sharding(r);
  EXPECT_EQ(p.all_gather_sent, 3 * (2 * 96 + 64) * 4);
  EXPECT_EQ(p.reduce_scatter_sent, 3 * 256 * 4);
  EXPECT_EQ(p.gathered_peak, (2 * 128 + 2 * 192 + 192) * 4);

  r.sharded = false;  // DDP: everything whole, one all-reduce 2·(W-1)/W·N per step
  p = plan_sharding(r);
  EXPECT_EQ(p.params + p.gradients + p.optimizer, 16 * 340);
  EXPECT_EQ(p.all_reduce_sent, 2 * 1 * 340 * 4 / 2);
  EXPECT_EQ(p.all_gather_sent + p.reduce_scatter_sent, 0);
}

TEST(ShardingPlan, LoraShardsTheAdaptersAndTheFrozenBase) {
  ShardingPlanRequest r = hand_case();
  r.lora = true;
  r.lora_rank = 2;
  r.lora_attn_modules = {"q_proj", "v_proj"};
  r.bytes_per_value = 2;
  ShardingPlan p = plan_sharding(r);
  // Per layer: q A (2,4) 8, B (4,2) 8; v A (2,4) 8, B (2,2) 4 = 28; each rounded to 16: 64 = shard 32.
  EXPECT_EQ(p.trainable_params, 2 * 28);
  EXPECT_EQ(p.frozen_params, 340);
  EXPECT_EQ(p.params, 2 * 32 * 2);
  // The base, sharded: layers 192 → 96 each, root 128 → 64; whole it is 340 values.
  EXPECT_EQ(p.frozen, (96 + 96 + 64) * 2);
  EXPECT_EQ(p.frozen_if_replicated, 340 * 2);
  // All-gathers: each layer's adapters (32) and base (96) shards, forward and backward; the root's base once.
  EXPECT_EQ(p.all_gather_sent, (2 * 2 * (32 + 96) + 64) * 2);
  EXPECT_EQ(p.reduce_scatter_sent, 2 * 32 * 2);  // gradients of the adapters only
  // Gathered: the root's base (128) + one layer's adapters with gradients (2 · 64) and base (192).
  EXPECT_EQ(p.gathered_peak, (128 + 2 * 64 + 192) * 2);
}

TEST(ShardingPlan, BadRequestsAreRefusedNamingTheField) {
  ShardingPlanRequest r = hand_case();
  r.nproc_per_node = 0;
  EXPECT_THROW(plan_sharding(r), Error);
  r = hand_case();
  r.lora = true;
  r.lora_attn_modules = {"o_proj"};
  try {
    plan_sharding(r);
    FAIL() << "o_proj accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lora_attn_modules"), std::string::npos) << e.what();
  }
  EXPECT_THROW(model_config_by_name_or_path("no/such-model"), Error);
  EXPECT_EQ(model_config_by_name_or_path("meta-llama/Llama-3.3-70B-Instruct").num_parameters(), 70553706496);
}

// Every model a runtime ships (manifests/make_runtimes.py) is known to the planner by its config
// name and its Hugging Face name, and its shape gives the parameter count its model card publishes
// (to the card's rounding: 0.49B, 1.54B, ...; Qwen2.5-7B's card truncates 7.6156B to 7.61B).
TEST(ShardingPlan, KnowsEveryRuntimesModelWithItsPublishedSize) {
  const struct {
    const char* name;
    const char* hub_name;
    double billions, rounding;
  } models[] = {{"qwen2_5/0.5B", "Qwen/Qwen2.5-0.5B-Instruct", 0.49, 0.005},
                {"qwen2_5/1.5B", "Qwen/Qwen2.5-1.5B-Instruct", 1.54, 0.005},
                {"qwen2_5/3B", "Qwen/Qwen2.5-3B-Instruct", 3.09, 0.005},
                {"qwen2_5/7B", "Qwen/Qwen2.5-7B-Instruct", 7.62, 0.005},
                {"mistral/7B", "mistralai/Mistral-7B-v0.1", 7.24, 0.005},
                {"gemma2/2B", "google/gemma-2-2b", 2.61, 0.005},
                {"gemma2/9B", "google/gemma-2-9b", 9.24, 0.005},
                {"gemma2/27B", "google/gemma-2-27b", 27.2, 0.05},
                {"llama3_1/70B", "meta-llama/Llama-3.1-70B-Instruct", 70.6, 0.05}};
  for (const auto& m : models) {
    const model::ModelConfig by_name = model_config_by_name_or_path(m.name);
    const double billions = double(by_name.num_parameters()) / 1e9;
    EXPECT_NEAR(billions, m.billions, m.rounding) << m.name;
    EXPECT_EQ(model_config_by_name_or_path(m.hub_name).num_parameters(), by_name.num_parameters()) << m.hub_name;
  }
}

TEST(ShardingPlan, AgreesWithWhatShardedDataParallelHolds) {
  model::ModelConfig c = model::ModelConfig::llama_like(97, 48, 3, 4, 2, 72);
  for (bool lora : {false, true}) {
    model::Decoder m(c, 1);
    if (lora) {
      model::LoraOptions o;
      o.rank = 4;
      model::attach_lora(m, model::LoraTargets{{"q_proj", "k_proj"}, true, false}, o);
    } else {
      m.set_trainable([](const std::string&) { return true; });
    }
    std::vector<model::Parameter*> trainable;
    for (model::Parameter* p : m.parameters())
      if (p->trainable) trainable.push_back(p);
    dist::SingleProcessGroup single;
    ShardedDataParallel sdp(m, trainable, single, {});
    ShardingPlanRequest r;
    r.model = c;
    r.lora = lora;
    r.lora_rank = 4;
    r.lora_attn_modules = {"q_proj", "k_proj"};
    r.apply_lora_to_mlp = true;
    ShardingPlan p = plan_sharding(r);
    EXPECT_EQ(p.params, sdp.memory().sharded_params) << "lora " << lora;
    EXPECT_EQ(p.gradients, sdp.memory().gradient_shards) << "lora " << lora;
    EXPECT_EQ(p.frozen, sdp.memory().sharded_frozen) << "lora " << lora;
    EXPECT_EQ(sdp.memory().replicated_frozen, 0) << "lora " << lora;
    // And at W = 4, from the runtime's own layouts.
    r.nproc_per_node = 4;
    int64_t shards = 0;
    for (const FlatShardLayout& l : sdp.layouts()) shards += FlatShardLayout::plan(l.numel, 4).shard_size();
    EXPECT_EQ(plan_sharding(r).params, shards * 4) << "lora " << lora;
  }
}
