// What the in-process sharded-data-parallel suites share (recipes/sharded_data_parallel_test.cpp in
// f32, bf16/bf16_sharded_test.cpp in bf16): a small untied Llama, deterministic rows for any rank,
// the reference run (one unsharded decoder that sees every rank's rows), one rank's training loop on
// ShardedDataParallel, and the threads that play the ranks over Gloo on loopback. Each suite keeps
// its own checks of what the ranks hold.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dist/process_group.h"
#include "dist/tcp_store.h"
#include "model/adapters/lora_adapter.h"
#include "model/decoder.h"
#include "train/optimizer.h"
#include "train/sharded_data_parallel.h"

namespace ktune::train::sharded_testing {

inline model::ModelConfig small_config() {
  model::ModelConfig c = model::ModelConfig::llama_like(/*vocab*/ 97, /*hidden*/ 48, /*layers*/ 3, /*heads*/ 4,
                                                        /*kv_heads*/ 2, /*intermediate*/ 72);
  c.tie_word_embeddings = false;
  return c;
}

constexpr int64_t kRowsPerRank = 2, kT = 11;
inline const AdamWSettings kAdam{1e-2, 0.9, 0.999, 1e-8, 0.01};

// Deterministic tokens and labels (B = rows, T = kT) for `rows` rows starting at global row `first`.
inline void make_rows(std::vector<int32_t>& tokens, std::vector<int32_t>& labels, int64_t first, int64_t rows, int step) {
  tokens.resize(size_t(rows * kT));
  labels.resize(size_t(rows * kT));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t t = 0; t < kT; ++t) {
      const int64_t g = (first + r) * kT + t;
      tokens[size_t(r * kT + t)] = int32_t((g * 31 + step * 7 + 3) % 97);
      labels[size_t(r * kT + t)] = (g + step) % 5 == 0 ? -100 : int32_t((g * 17 + step) % 97);
    }
}

struct Scenario {
  DType dtype = DType::F32;  // the decoder's weights (LoRA adapters stay f32)
  bool lora = false, dora = false, qlora = false;
  bool reshard_after_forward = true;
  bool checkpointing = false;
  int steps = 2;
  int micro_batches = 1;  // gradient accumulation: sharded runs reduce-scatter every micro-batch
  double clip = 0.5;      // clip_grad_norm; a huge value only measures the norm
  int64_t rows_per_rank = kRowsPerRank;
};

// Full fine-tune (every weight trainable), or LoRA/DoRA/QLoRA on q, v, o and the MLP of a frozen base
// (the decoder's Linears hold the adapters).
inline std::unique_ptr<model::Decoder> make_model(const Scenario& s) {
  auto m = std::make_unique<model::Decoder>(small_config(), /*seed*/ 5, s.dtype);
  if (s.lora) {
    model::LoraOptions o;
    o.rank = 4;
    o.alpha = 8;
    o.seed = 9;
    o.use_dora = s.dora;
    o.quantize_base = s.qlora;
    model::attach_lora(*m, model::LoraTargets{{"q_proj", "v_proj", "output_proj"}, true, false}, o);
    // B starts at zero; move it so that A's gradient is not zero either.
    for (model::Parameter* p : m->parameters())
      if (p->name.find("lora_B") != std::string::npos)
        for (int64_t i = 0; i < p->value.numel(); ++i) p->value.f32()[i] = 0.01f * float((i * 7) % 13 - 6);
  } else {
    m->set_trainable([](const std::string&) { return true; });
  }
  m->set_activation_checkpointing(s.checkpointing);
  return m;
}

inline std::vector<model::Parameter*> trainable_of(model::Decoder& m) {
  std::vector<model::Parameter*> out;
  for (model::Parameter* p : m.parameters())
    if (p->trainable) out.push_back(p);
  return out;
}

struct Outcome {
  std::vector<double> losses, norms;
  std::map<std::string, Tensor> weights;  // trainable, after the last step, in their stored dtype
  std::map<std::string, Tensor> moments;  // AdamW's state, as a checkpoint holds it
};

// One decoder, every rank's rows in one batch, plain AdamW.
inline Outcome reference(const Scenario& s, int world) {
  auto m = make_model(s);
  auto trainable = trainable_of(*m);
  AdamW opt(trainable, kAdam);
  Outcome out;
  std::vector<int32_t> tokens, labels;
  const int64_t rows = s.rows_per_rank * world;
  for (int step = 0; step < s.steps; ++step) {
    m->zero_grad();
    double loss = 0, n = 0;
    for (int micro = 0; micro < s.micro_batches; ++micro) {
      make_rows(tokens, labels, 0, rows, step * s.micro_batches + micro);
      model::LossResult r = m->forward_backward({tokens.data(), labels.data(), nullptr, nullptr, rows, kT}, 1.0f);
      loss += r.loss_sum;
      n += double(r.n_valid);
    }
    scale_gradients(trainable, float(1.0 / n));
    out.norms.push_back(clip_gradient_norm(trainable, s.clip));
    out.losses.push_back(loss / n);
    opt.step(kAdam.lr);
  }
  for (model::Parameter* p : trainable) out.weights[p->name] = p->value.clone();
  out.moments = opt.state();
  return out;
}

// Rank `rank`'s steps on its own rows: loss and label tokens summed over the world, gradients
// scaled by the global token count, clipped (the norm recorded), AdamW on the shards.
inline void train_sharded(ShardedDataParallel& sdp, AdamW& opt, dist::ProcessGroup& group, const Scenario& s, int rank,
                          Outcome* out) {
  std::vector<int32_t> tokens, labels;
  for (int step = 0; step < s.steps; ++step) {
    sdp.zero_grad();
    double sums[2] = {0, 0};
    for (int micro = 0; micro < s.micro_batches; ++micro) {
      make_rows(tokens, labels, s.rows_per_rank * rank, s.rows_per_rank, step * s.micro_batches + micro);
      model::LossResult r =
          sdp.forward_backward({tokens.data(), labels.data(), nullptr, nullptr, s.rows_per_rank, kT}, 1.0f);
      sums[0] += r.loss_sum;
      sums[1] += double(r.n_valid);
    }
    group.allreduce_sum(sums, 2);
    scale_gradients(opt.params(), float(1.0 / sums[1]));
    out->norms.push_back(sdp.clip_gradient_norm(s.clip));
    out->losses.push_back(sums[0] / sums[1]);
    opt.step(kAdam.lr);
  }
}

// Plays `world` ranks as threads over Gloo (a TCP store on loopback): rank_main(rank, group) on each;
// a rank's exception fails the test with its message.
inline void run_ranks(int world, const std::string& group_name,
                      const std::function<void(int rank, dist::ProcessGroup& group)>& rank_main) {
  using namespace std::chrono_literals;
  dist::TcpStoreServer server(0);
  std::vector<std::string> failures(static_cast<size_t>(world));
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < world; ++rank)
    ranks.emplace_back([&, rank] {
      try {
        dist::TcpStore store("127.0.0.1", server.port(), 60s);
        auto group = dist::make_gloo_process_group(store, group_name, rank, world, "127.0.0.1", 60s);
        rank_main(rank, *group);
      } catch (const std::exception& e) {
        failures[size_t(rank)] = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  for (int r = 0; r < world; ++r) EXPECT_EQ(failures[size_t(r)], "") << "rank " << r;
}

}  // namespace ktune::train::sharded_testing
