// The fused head on a bf16 weight multiplied as bf16 (linear_cross_entropy_bf16) against the
// materialised f32 reference: with bf16-valued hidden rows the logits' operands are exact, so the loss
// matches to f32 accumulation; the gradients go through bf16(dlogits) (2^-9 relative), and a bf16
// weight gradient adds a rounding per chunk and block of vocabulary rows. Also several dW blocks
// (V*C above kWeightGradientBlockFloats), soft-capping, ignored labels, and the loss alone.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "bf16_values.h"
#include "gradient_check.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/linear.h"

using namespace ktune;
using namespace ktune::cpu;
using namespace ktune::cpu::testing;

namespace {


std::vector<int32_t> some_ignored_labels(int64_t N, int64_t V) {
  std::vector<int32_t> labels(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) labels[size_t(i)] = i % 5 == 1 ? kIgnoreIndex : int32_t((i * 7919) % V);
  return labels;
}

struct Case {
  int64_t N, C, V, chunk;
  float softcap;
};

// Runs the bf16 head on hidden (bf16-valued when exact_hidden) and compares with the reference on
// the widened weight: loss, dhidden, and dW both as f32 (+=) and as bf16 (+=, rounded per block).
void expect_matches_reference(const Case& k, bool exact_hidden) {
  const std::string tag = " N=" + std::to_string(k.N) + " C=" + std::to_string(k.C) + " V=" + std::to_string(k.V) +
                          " chunk=" + std::to_string(k.chunk) + " softcap=" + std::to_string(k.softcap) +
                          (exact_hidden ? " bf16-valued hidden" : "");
  auto w16 = to_bf16(random_vector(size_t(k.V * k.C), 2, -0.5f, 0.5f));
  auto w = widened(w16);
  auto hidden = random_vector(size_t(k.N * k.C), 1, -1, 1);
  if (exact_hidden) hidden = widened(to_bf16(hidden));
  auto labels = some_ignored_labels(k.N, k.V);
  auto dw16 = to_bf16(random_vector(size_t(k.V * k.C), 3, -1e-2f, 1e-2f));  // a gradient to add to
  const float grad_scale = 0.37f;

  std::vector<float> dh_ref(size_t(k.N * k.C)), dw_ref = widened(dw16);
  int64_t n_ref = -1;
  const double loss_ref = linear_cross_entropy_reference(dh_ref.data(), dw_ref.data(), &n_ref, hidden.data(), w.data(),
                                                         labels.data(), k.N, k.C, k.V, k.softcap, grad_scale);
  std::vector<float> scratch(linear_cross_entropy_bf16_scratch_floats(k.chunk, k.V, k.C));
  std::vector<float> dh(size_t(k.N * k.C), NAN), dw = widened(dw16);
  int64_t n_valid = -1;
  const double loss = linear_cross_entropy_bf16(dh.data(), dw.data(), nullptr, &n_valid, hidden.data(), w16.data(),
                                                labels.data(), k.N, k.C, k.V, k.softcap, grad_scale, k.chunk,
                                                scratch.data());
  EXPECT_EQ(n_valid, n_ref) << tag;
  // Exact operands: f32 accumulation only. Rounded hidden rows: 2^-9 relative on each, averaged.
  // The gradients (max error / max |reference|), measured: dhidden <= 3.1e-3, dW f32 <= 4.5e-3, dW bf16
  // <= 1.5e-2 (24 chunks of one token: 24 roundings).
  EXPECT_NEAR(loss, loss_ref, (exact_hidden ? 1e-5 : 1e-3) * std::fabs(loss_ref)) << tag;
  expect_close(dh, dh_ref, 5e-3, "dhidden" + tag);
  expect_close(dw, dw_ref, 8e-3, "dweight (f32)" + tag);
  for (int64_t c = 0; c < k.C; ++c) ASSERT_EQ(dh[size_t(1 * k.C + c)], 0.0f) << "ignored row" << tag;

  std::vector<bf16_t> dw_bf16 = dw16;
  const double loss_again = linear_cross_entropy_bf16(nullptr, nullptr, dw_bf16.data(), nullptr, hidden.data(),
                                                      w16.data(), labels.data(), k.N, k.C, k.V, k.softcap, grad_scale,
                                                      k.chunk, scratch.data());
  EXPECT_EQ(loss_again, loss) << tag;
  // The f32 sum's error, plus one rounding of 2^-9 per chunk on an element of up to the buffer's scale.
  const int64_t chunks = (n_ref + k.chunk - 1) / k.chunk;
  expect_close(widened(dw_bf16), dw_ref, 8e-3 + double(chunks) * std::ldexp(1.0, -9), "dweight (bf16)" + tag);

  const double loss_only = linear_cross_entropy_bf16(nullptr, nullptr, nullptr, nullptr, hidden.data(), w16.data(),
                                                     labels.data(), k.N, k.C, k.V, k.softcap, 1.0f, k.chunk,
                                                     scratch.data());
  EXPECT_EQ(loss_only, loss) << "the loss alone" << tag;
}

}  // namespace

TEST(CrossEntropyBf16, MatchesTheF32ReferenceWithinBf16RoundingOfTheGemmOperands) {
  for (bool exact_hidden : {true, false})
    for (float softcap : {0.0f, 3.0f})
      for (int64_t chunk : {int64_t(1), int64_t(7), int64_t(100)})
        expect_matches_reference({29, 40, 317, chunk, softcap}, exact_hidden);
}

TEST(CrossEntropyBf16, AWeightGradientOfSeveralBlocksOfVocabularyRows) {
  // V * C = 1.5 Mi floats: dW in two blocks of kWeightGradientBlockFloats / C rows (the second partial).
  const int64_t C = 512, V = 3 * (kWeightGradientBlockFloats / C) / 2 + 5;
  ASSERT_GT(V * C, kWeightGradientBlockFloats);
  expect_matches_reference({11, C, V, 4, 0.0f}, true);
}

TEST(CrossEntropyBf16, RefusesTwoWeightGradientsAndBadLabels) {
  const int64_t N = 3, C = 8, V = 5;
  std::vector<bf16_t> w(size_t(V * C), f32_to_bf16(0.1f)), dw16(w.size());
  std::vector<float> hidden(size_t(N * C), 0.5f), dw(w.size()), scratch(linear_cross_entropy_bf16_scratch_floats(2, V, C));
  std::vector<int32_t> labels = {0, 4, kIgnoreIndex};
  EXPECT_THROW(linear_cross_entropy_bf16(nullptr, dw.data(), dw16.data(), nullptr, hidden.data(), w.data(),
                                         labels.data(), N, C, V, 0.0f, 1.0f, 2, scratch.data()),
               Error);
  labels[1] = 5;
  EXPECT_THROW(linear_cross_entropy_bf16(nullptr, nullptr, nullptr, nullptr, hidden.data(), w.data(), labels.data(), N,
                                         C, V, 0.0f, 1.0f, 2, scratch.data()),
               Error);
}
