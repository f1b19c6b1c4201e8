// Sharded data parallelism in-process: the flat layout's arithmetic by hand and by property, and
// ShardedDataParallel on W = 1, 2, 3 ranks (threads over Gloo) against one unsharded decoder that
// sees every rank's rows: same loss, same gradient norm, same weights after AdamW steps — for a
// full fine-tune (with and without resharding after the forward, with activation checkpointing)
// and for LoRA (frozen base and adapters sharded).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <random>

#include "../sharded_test_fixture.h"
#include "core/error.h"
#include "core/parallel.h"
#include "train/sharded_layout.h"

using namespace ktune;
using namespace ktune::train;

TEST(FlatShardLayout, OffsetsPaddingAndShardRangesMatchAHandComputedCase) {
  // Sizes 5, 20, 3: offsets 0, 16, 48 (each start aligned to 16 floats); payload ends at 51.
  FlatShardLayout w1 = FlatShardLayout::plan({5, 20, 3}, 1);
  EXPECT_EQ(w1.offset, (std::vector<int64_t>{0, 16, 48}));
  EXPECT_EQ(w1.padded, 64);
  EXPECT_EQ(w1.shard_size(), 64);
  EXPECT_EQ(w1.payload(), 28);
  EXPECT_EQ(w1.param_in_shard(2, 0), (std::pair<int64_t, int64_t>{48, 51}));

  FlatShardLayout w2 = FlatShardLayout::plan({5, 20, 3}, 2);  // 64 is a multiple of 32: S = 32
  EXPECT_EQ(w2.padded, 64);
  EXPECT_EQ(w2.shard_size(), 32);
  EXPECT_EQ(w2.param_in_shard(0, 0), (std::pair<int64_t, int64_t>{0, 5}));
  EXPECT_EQ(w2.param_in_shard(1, 0), (std::pair<int64_t, int64_t>{16, 32}));
  EXPECT_EQ(w2.param_in_shard(1, 1), (std::pair<int64_t, int64_t>{32, 36}));  // p1 straddles the shards
  EXPECT_EQ(w2.param_in_shard(2, 1), (std::pair<int64_t, int64_t>{48, 51}));
  auto r = w2.param_in_shard(2, 0);
  EXPECT_EQ(r.first, r.second);  // p2 is not on rank 0

  FlatShardLayout w3 = FlatShardLayout::plan({5, 20, 3}, 3);  // 64 rounded up to a multiple of 48: 96, S = 32
  EXPECT_EQ(w3.padded, 96);
  EXPECT_EQ(w3.shard_size(), 32);
  EXPECT_EQ(w3.shard_begin(2), 64);
  for (size_t i = 0; i < 3; ++i) {  // rank 2 holds padding only
    auto e = w3.param_in_shard(i, 2);
    EXPECT_EQ(e.first, e.second) << i;
  }
  EXPECT_EQ(FlatShardLayout::plan({}, 3).padded, 0);
}

TEST(FlatShardLayout, EveryElementIsOwnedByExactlyOneRankAndShardsAreAligned) {
  std::mt19937 rng(11);
  for (int world = 1; world <= 5; ++world)
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<int64_t> sizes(1 + rng() % 7);
      for (int64_t& s : sizes) s = int64_t(rng() % 300);
      FlatShardLayout l = FlatShardLayout::plan(sizes, world);
      ASSERT_EQ(l.padded % (FlatShardLayout::kAlignFloats * world), 0);
      ASSERT_EQ(l.shard_size() % FlatShardLayout::kAlignFloats, 0);
      ASSERT_LT(l.padded - l.payload(), FlatShardLayout::kAlignFloats * int64_t(sizes.size() + size_t(world)));
      for (size_t i = 0; i < sizes.size(); ++i) {
        ASSERT_EQ(l.offset[i] % FlatShardLayout::kAlignFloats, 0);
        if (i > 0) {
          ASSERT_GE(l.offset[i], l.offset[i - 1] + sizes[i - 1]);
        }
        int64_t owned = 0, next = l.offset[i];
        for (int rank = 0; rank < world; ++rank) {
          auto [lo, hi] = l.param_in_shard(i, rank);
          if (lo == hi) continue;
          ASSERT_EQ(lo, next) << "parts must tile the parameter in rank order";
          ASSERT_GE(lo, l.shard_begin(rank));
          ASSERT_LE(hi, l.shard_begin(rank) + l.shard_size());
          owned += hi - lo;
          next = hi;
        }
        ASSERT_EQ(owned, sizes[i]) << "world " << world << " param " << i;
      }
    }
}

TEST(ShardedLayerOfParameter, NamesTheDecoderLayerOrTheRoot) {
  EXPECT_EQ(layer_of_parameter("model.layers.0.self_attn.q_proj.weight"), 0);
  EXPECT_EQ(layer_of_parameter("model.layers.17.mlp.down_proj.weight"), 17);
  EXPECT_EQ(layer_of_parameter("base_model.model.model.layers.3.self_attn.v_proj.lora_A.weight"), 3);
  EXPECT_EQ(layer_of_parameter("model.embed_tokens.weight"), -1);
  EXPECT_EQ(layer_of_parameter("model.norm.weight"), -1);
  EXPECT_EQ(layer_of_parameter("lm_head.weight"), -1);
  EXPECT_EQ(layer_of_parameter("model.layers.x.weight"), -1);
}

namespace {

using namespace sharded_testing;  // NOLINT: the shared model, rows, reference run and rank threads

// The same as reference() on `world` ranks (threads over Gloo), each with its rows, sharded; the
// result of rank 0, after checking what every rank holds.
// As a checkpoint streams them (rank 0 writes each unit's as the ranks gather it): a sink that throws
// at its first tensor (a full disk) stops no gather, so the ranks stay in step (a rank that stopped
// would leave the others waiting in the next unit's gather); then rank 0's sinks get every moment
// and value once, bit for bit the gathered ones, each named and shaped as optimizer_state_specs
// says, and no unit stays gathered.
void expect_streamed_as_gathered(ShardedDataParallel& sdp, const AdamW& opt, int rank,
                                 const std::map<std::string, Tensor>& moments, const std::map<std::string, Tensor>& values) {
  const io::TensorSink full_disk = [](const std::string& name, const Tensor&) { throw Error(name, "No space left on device"); };
  if (rank == 0) {
    EXPECT_THROW(sdp.stream_optimizer_state(opt, full_disk), Error);
    EXPECT_THROW(sdp.stream_full_parameters(full_disk), Error);
  } else {
    sdp.stream_optimizer_state(opt, io::TensorSink());
    sdp.stream_full_parameters(io::TensorSink());
  }
  std::map<std::string, Tensor> streamed_moments, streamed_values;
  auto into = [](std::map<std::string, Tensor>& got) {
    return [&got](const std::string& name, const Tensor& t) {
      EXPECT_EQ(got.count(name), 0u) << name << " streamed twice";
      got[name] = t.to(DType::F32);
    };
  };
  sdp.stream_optimizer_state(opt, rank == 0 ? io::TensorSink(into(streamed_moments)) : io::TensorSink());
  sdp.stream_full_parameters(rank == 0 ? io::TensorSink(into(streamed_values)) : io::TensorSink());
  if (rank != 0) return;
  const std::vector<io::TensorSpec> specs = sdp.optimizer_state_specs(opt);
  ASSERT_EQ(specs.size(), moments.size());
  for (const io::TensorSpec& spec : specs) {
    ASSERT_TRUE(moments.count(spec.name)) << spec.name;
    EXPECT_EQ(spec.shape, moments.at(spec.name).shape()) << spec.name;
    EXPECT_EQ(spec.dtype, moments.at(spec.name).dtype()) << spec.name;
  }
  for (const auto& [want, got] : {std::pair{&moments, &streamed_moments}, std::pair{&values, &streamed_values}}) {
    ASSERT_EQ(got->size(), want->size());
    for (const auto& [name, t] : *want) {
      const Tensor wide = t.to(DType::F32);
      ASSERT_TRUE(got->count(name)) << name << " not streamed";
      ASSERT_EQ(got->at(name).shape(), wide.shape()) << name;
      EXPECT_EQ(std::memcmp(got->at(name).raw(), wide.raw(), wide.bytes()), 0) << name << " streamed differs";
    }
  }
}

// As a LoRA checkpoint gathers them: the trainable values whole on rank 0 only (the others took
// part), the frozen base not held; then the frozen base unit by unit, a `held` that throws at its
// first unit (a full disk) stopping no gather, then rank 0's `held` getting every frozen parameter
// once, named as frozen_specs names them in their order, its value held for the call, bit for bit
// the gathered one; nothing stays held.
void expect_lora_save_parts_as_gathered(ShardedDataParallel& sdp, model::Decoder& m,
                                        const std::vector<model::Parameter*>& trainable, int rank) {
  std::map<std::string, Tensor> gathered;  // every value as gather_full_parameters gives it
  sdp.gather_full_parameters();
  for (model::Parameter* p : m.parameters())
    if (p->value.defined()) gathered[p->name] = p->value.clone();
  sdp.release_full_parameters();
  sdp.gather_trainable_parameters(/*keep=*/rank == 0);
  for (model::Parameter* p : m.parameters()) {
    const bool is_trainable = std::find(trainable.begin(), trainable.end(), p) != trainable.end();
    EXPECT_EQ(p->value.defined(), is_trainable && rank == 0) << p->name;
    if (p->value.defined()) {
      EXPECT_EQ(std::memcmp(p->value.raw(), gathered.at(p->name).raw(), p->value.bytes()), 0) << p->name;
    }
  }
  const auto full_disk = [](const std::vector<std::string>& names) { throw Error(names.front(), "No space left on device"); };
  const std::vector<io::TensorSpec> specs = sdp.frozen_specs();
  if (rank == 0 && !specs.empty()) {
    EXPECT_THROW(sdp.stream_frozen_parameters(full_disk), Error);
  }
  else
    sdp.stream_frozen_parameters(nullptr);
  std::vector<std::string> order;
  sdp.stream_frozen_parameters(rank != 0 ? nullptr : std::function<void(const std::vector<std::string>&)>(
      [&](const std::vector<std::string>& names) {
        for (const std::string& name : names) {
          order.push_back(name);
          const Tensor& value = m.parameter(name).value;
          ASSERT_TRUE(value.defined()) << name << " not held for its call";
          ASSERT_TRUE(gathered.count(name)) << name;
          EXPECT_EQ(std::memcmp(value.raw(), gathered.at(name).raw(), value.bytes()), 0) << name << " streamed differs";
        }
      }));
  sdp.release_full_parameters();
  for (model::Parameter* p : m.parameters()) EXPECT_FALSE(p->value.defined()) << p->name << " still held";
  if (rank != 0) return;
  ASSERT_EQ(order.size(), specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_EQ(order[i], specs[i].name);
    EXPECT_EQ(specs[i].shape, gathered.at(specs[i].name).shape()) << specs[i].name;
    EXPECT_EQ(specs[i].dtype, gathered.at(specs[i].name).dtype()) << specs[i].name;
  }
}

Outcome sharded(const Scenario& s, int world) {
  std::vector<Outcome> outcomes(static_cast<size_t>(world));
  run_ranks(world, "sdp", [&](int rank, dist::ProcessGroup& group) {
    auto m = make_model(s);
    auto trainable = trainable_of(*m);
    ShardedDataParallel sdp(*m, trainable, group, ShardingOptions{s.reshard_after_forward});
    for (model::Parameter* p : m->parameters()) EXPECT_FALSE(p->value.defined()) << p->name << " kept whole";
    EXPECT_EQ(sdp.memory().replicated_frozen, 0);  // f32 frozen weights are all sharded (QLoRA: NF4 lives in the adapters)
    AdamW opt(sdp.shard_parameters(), kAdam);
    Outcome& out = outcomes[size_t(rank)];
    train_sharded(sdp, opt, group, s, rank, &out);
    // The moments survive a round trip through the unsharded naming (checkpoints).
    std::map<std::string, Tensor> full = sdp.gather_optimizer_state(opt);
    EXPECT_EQ(full.size(), 2 * trainable.size());
    std::map<std::string, Tensor> back = sdp.shard_optimizer_state(full, "test");
    for (const auto& [name, t] : opt.state())
      for (int64_t i = 0; i < t.numel(); ++i) ASSERT_EQ(back.at(name).f32()[i], t.f32()[i]) << name;
    sdp.gather_full_parameters();
    for (model::Parameter* p : trainable) out.weights[p->name] = p->value.to(DType::F32);
    sdp.release_full_parameters();
    // As a checkpoint gathers: only rank 0 keeps what it gathers (the others took part).
    EXPECT_EQ(sdp.gather_optimizer_state(opt, rank == 0).size(), rank == 0 ? 2 * trainable.size() : 0u);
    sdp.gather_full_parameters(rank == 0);
    for (model::Parameter* p : trainable) EXPECT_EQ(p->value.defined(), rank == 0) << p->name;
    sdp.release_full_parameters();
    expect_streamed_as_gathered(sdp, opt, rank, full, out.weights);
    expect_lora_save_parts_as_gathered(sdp, *m, trainable, rank);
    // Loading the gathered weights back gives the same shards.
    std::vector<Tensor> before;
    for (model::Parameter* p : sdp.shard_parameters()) before.push_back(p->value.to(DType::F32));
    sdp.load_full_parameters(out.weights, "test");
    auto shards = sdp.shard_parameters();
    for (size_t k = 0; k < shards.size(); ++k)
      for (int64_t i = 0; i < before[k].numel(); ++i) ASSERT_EQ(shards[k]->value.f32()[i], before[k].f32()[i]);
  });
  // Every rank ends with the same weights.
  for (int r = 1; r < world; ++r)
    for (const auto& [name, t] : outcomes[0].weights)
      for (int64_t i = 0; i < t.numel(); ++i) EXPECT_EQ(outcomes[size_t(r)].weights.at(name).f32()[i], t.f32()[i]);
  return outcomes[0];
}

void expect_same(const Outcome& a, const Outcome& b, const std::string& what, Scenario s) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i) {
    EXPECT_NEAR(a.losses[i], b.losses[i], 1e-5 * std::max(1.0, std::fabs(b.losses[i]))) << what << " step " << i;
    EXPECT_NEAR(a.norms[i], b.norms[i], 1e-4 * std::max(1.0, b.norms[i])) << what << " step " << i;
  }
  ASSERT_EQ(a.weights.size(), b.weights.size()) << what;
  double worst = 0, moved = 0;
  for (const auto& [name, t] : b.weights) {
    const Tensor& u = a.weights.at(name);
    ASSERT_EQ(u.numel(), t.numel()) << name;
    for (int64_t i = 0; i < t.numel(); ++i) worst = std::max(worst, double(std::fabs(u.f32()[i] - t.f32()[i])));
  }
  // The steps moved the weights far more than the difference (the comparison is not vacuous).
  s.steps = 0;
  auto initial = reference(s, 1);
  for (const auto& [name, t] : b.weights)
    for (int64_t i = 0; i < t.numel(); ++i) moved = std::max(moved, double(std::fabs(initial.weights.at(name).f32()[i] - t.f32()[i])));
  EXPECT_LT(worst, 2e-5) << what;
  EXPECT_GT(moved, 1e-3) << what;
}

class ShardedDataParallelTest : public ::testing::Test {
 protected:
  void SetUp() override { set_num_threads(1); }
};

}  // namespace

TEST_F(ShardedDataParallelTest, FullFinetuneOnOneTwoThreeRanksMatchesOneUnshardedDecoder) {
  for (int world : {1, 2, 3}) {
    Scenario s;
    expect_same(sharded(s, world), reference(s, world), "full W=" + std::to_string(world), s);
  }
}

TEST_F(ShardedDataParallelTest, KeepingLayersGatheredAfterTheForwardAndCheckpointingChangeNothing) {
  Scenario s;
  s.reshard_after_forward = false;
  expect_same(sharded(s, 2), reference(s, 2), "full no-reshard W=2", s);
  s.reshard_after_forward = true;
  s.checkpointing = true;
  expect_same(sharded(s, 2), reference(s, 2), "full checkpointing W=2", s);
}

TEST_F(ShardedDataParallelTest, GradientAccumulationOverMicroBatchesMatchesOneUnshardedDecoder) {
  Scenario s;
  s.micro_batches = 3;
  expect_same(sharded(s, 2), reference(s, 2), "full 3 micro-batches W=2", s);
}

TEST_F(ShardedDataParallelTest, LoraWithAdaptersAndBaseShardedMatchesOneUnshardedDecoder) {
  for (int world : {2, 3}) {
    Scenario s;
    s.lora = true;
    expect_same(sharded(s, world), reference(s, world), "lora W=" + std::to_string(world), s);
  }
}

TEST_F(ShardedDataParallelTest, DoraAndQloraShardedMatchOneUnshardedDecoder) {
  Scenario s;
  s.lora = true;
  s.dora = true;  // the magnitude is sharded with its layer, the base gathered for the row norms
  expect_same(sharded(s, 2), reference(s, 2), "lora dora W=2", s);
  s.dora = false;
  s.qlora = true;  // the NF4 base stays in its adapters (replicated); the rest is sharded
  expect_same(sharded(s, 2), reference(s, 2), "lora qlora W=2", s);
}

TEST_F(ShardedDataParallelTest, PerRankParameterGradientAndOptimizerBytesFallAsOneOverW) {
  Scenario s;
  auto m = make_model(s);
  int64_t total = 0;
  for (model::Parameter* p : trainable_of(*m)) total += p->value.numel();
  dist::SingleProcessGroup single;
  ShardedDataParallel one(*m, trainable_of(*m), single, {});
  EXPECT_EQ(one.memory().replicated_frozen, 0);
  // W = 1: the shard is the model plus the per-parameter alignment padding only.
  EXPECT_GE(one.memory().sharded_params, 4 * total);
  EXPECT_LT(one.memory().sharded_params, 4 * total + 4 * 16 * 64);
  for (int world : {2, 3, 8}) {
    int64_t shard_floats = 0;
    for (const FlatShardLayout& l : one.layouts()) shard_floats += FlatShardLayout::plan(l.numel, world).shard_size();
    EXPECT_NEAR(double(shard_floats), double(total) / world, 16.0 * 64) << world;
  }
}
