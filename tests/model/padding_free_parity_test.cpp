// Padding-free batches (data/padding_free.h) train exactly like the padded batches they come from:
// on the small random models of each family (fixtures/, Gemma 2's with a sliding window of 5 and
// soft-capping), the loss, the label count and every parameter gradient of a right-padded batch
// (doc_ids absent, as the recipe ran unpacked batches) equal those of the same batch laid as one row
// and as rows of at most T, with activation checkpointing too, and with LoRA adapters (their B made
// non-zero so that every adapter gradient is). Tolerance: relative error (max|a - b| / max|b|)
// <= 2e-5 on the loss and on each gradient: only f32 summation order differs. Part of
// ktune_model_tests: one thread unless KTUNE_NUM_THREADS asks (decoder_parity_test.cpp's environment).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "data/data_loader.h"
#include "data/padding_free.h"
#include "model/adapters/lora_adapter.h"
#include "model/decoder.h"
#include "relative_error.h"

using namespace ktune;
using ktune::testing::rel_error;

namespace {

constexpr int64_t kOneRow = 1 << 30;
constexpr double kTolerance = 2e-5;

// A right-padded batch of samples of the given lengths, random tokens (ids 1..V-1, pad 0), every
// third label -100, collated and shifted as the loader and the recipe do.
Batch padded_batch(const std::vector<int64_t>& lengths, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> id(1, int32_t(vocab - 1));
  Batch b;
  b.batch_size = int64_t(lengths.size());
  for (int64_t len : lengths) b.seq_len = std::max(b.seq_len, len);
  for (int64_t len : lengths)
    for (int64_t t = 0; t < b.seq_len; ++t) {
      const bool real = t < len;
      const int32_t token = real ? id(rng) : 0;
      b.tokens.push_back(token);
      b.labels.push_back(real && t % 3 != 0 ? token : kIgnoreIndex);
      b.positions.push_back(int32_t(t));
      b.doc_ids.push_back(real ? 0 : 1);
    }
  shift_labels(b);
  return b;
}

struct StepResult {
  model::LossResult loss;
  std::map<std::string, std::vector<float>> grads;
};

StepResult train_step(model::Decoder& m, const Batch& b, bool documents) {
  m.zero_grad();
  model::Batch mb{b.tokens.data(), b.labels.data(), b.positions.data(), documents ? b.doc_ids.data() : nullptr,
                  b.batch_size, b.seq_len};
  StepResult r;
  r.loss = m.forward_backward(mb, 1.0f);
  for (model::Parameter* p : m.parameters())
    if (p->trainable && p->grad.defined()) {
      const float* g = p->grad.f32();
      r.grads[p->name].assign(g, g + p->grad.numel());
    }
  return r;
}

void expect_same_step(const StepResult& got, const StepResult& want, const std::string& what) {
  EXPECT_EQ(got.loss.n_valid, want.loss.n_valid) << what;
  EXPECT_LE(std::fabs(got.loss.loss_sum - want.loss.loss_sum) / std::fabs(want.loss.loss_sum), kTolerance) << what;
  ASSERT_EQ(got.grads.size(), want.grads.size()) << what;
  for (const auto& [name, g] : want.grads) {
    const auto it = got.grads.find(name);
    ASSERT_NE(it, got.grads.end()) << what << ": no gradient for " << name;
    EXPECT_LE(rel_error(it->second.data(), g.data(), int64_t(g.size())), kTolerance) << what << ": gradient of " << name;
  }
}

std::unique_ptr<model::Decoder> load(const std::string& family) {
  auto m = model::Decoder::from_pretrained(std::string(KTUNE_SOURCE_DIR) + "/tests/model/fixtures/" + family);
  m->set_trainable([](const std::string&) { return true; });
  return m;
}

// Lengths 13, 5, 9, 2 (T = 13): 52 padded positions, 29 real; rows of at most 13: {13}, {9, 2}, {5}.
void check_padding_free(model::Decoder& m, const std::string& what) {
  const Batch padded = padded_batch({13, 5, 9, 2}, m.config().vocab_size, 11);
  const StepResult want = train_step(m, padded, /*documents=*/false);
  ASSERT_GT(want.loss.n_valid, 0);
  ASSERT_FALSE(want.grads.empty());
  const Batch one_row = remove_padding(padded, kOneRow);
  ASSERT_EQ(one_row.batch_size * one_row.seq_len, 29);
  expect_same_step(train_step(m, one_row, true), want, what + ", one row");
  const Batch rows = remove_padding(padded, padded.seq_len);
  ASSERT_EQ(rows.batch_size, 3);
  expect_same_step(train_step(m, rows, true), want, what + ", rows of at most T");
}

class PaddingFreeParity : public ::testing::TestWithParam<std::string> {};

TEST_P(PaddingFreeParity, LossAndEveryGradientEqualThePaddedBatchs) {
  auto m = load(GetParam());
  check_padding_free(*m, GetParam());
}

TEST_P(PaddingFreeParity, WithActivationCheckpointing) {
  auto m = load(GetParam());
  m->set_activation_checkpointing(true);
  check_padding_free(*m, GetParam() + " checkpointed");
}

TEST_P(PaddingFreeParity, WithLoraAdapters) {
  auto m = load(GetParam());
  model::LoraOptions options;
  options.rank = 4;
  options.seed = 5;
  auto adapters = model::attach_lora(*m, model::LoraTargets{{"q_proj", "k_proj", "v_proj", "output_proj"}, true, false}, options);
  ASSERT_FALSE(adapters.empty());
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  for (auto& a : adapters)
    for (model::Parameter* p : a->parameters())
      if (p->name.find("lora_B") != std::string::npos)
        for (int64_t i = 0; i < p->value.numel(); ++i) p->value.f32()[i] = normal(rng);
  check_padding_free(*m, GetParam() + " LoRA");
}

INSTANTIATE_TEST_SUITE_P(Families, PaddingFreeParity, ::testing::Values("llama", "qwen2", "mistral", "gemma2"),
                         [](const auto& info) { return info.param; });

}  // namespace
