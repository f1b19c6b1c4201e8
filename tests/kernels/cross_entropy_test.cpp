// Fused linear + cross-entropy: against the materialised reference (ignored labels, chunks that do
// not divide N, soft-capping, gradients on or off), against finite differences, and bad labels.
#include "kernels/cpu/cross_entropy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "gradient_check.h"

using namespace ktune::cpu;
using namespace ktune::cpu::testing;

namespace {

std::vector<int32_t> labels_with_ignored(int64_t N, int64_t V) {
  std::vector<int32_t> labels(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) labels[size_t(i)] = int32_t((i * 7919) % V);
  // an ignored prefix (a prompt), a lone ignored token, an ignored tail
  for (int64_t i = 0; i < std::min<int64_t>(N, 6); ++i) labels[size_t(i)] = kIgnoreIndex;
  if (N > 20) labels[20] = kIgnoreIndex;
  for (int64_t i = std::max<int64_t>(0, N - 3); i < N; ++i) labels[size_t(i)] = kIgnoreIndex;
  return labels;
}

}  // namespace

TEST(CrossEntropy, FusedMatchesReference) {
  const int64_t N = 45, C = 40, V = 317;
  auto hidden = random_vector(size_t(N * C), 1, -1, 1), weight = random_vector(size_t(V * C), 2, -0.5f, 0.5f);
  auto labels = labels_with_ignored(N, V);
  for (float softcap : {0.0f, 2.0f})
    for (int64_t chunk : {int64_t(1), int64_t(7), int64_t(16), int64_t(1000)}) {
      const std::string tag = " softcap=" + std::to_string(softcap) + " chunk=" + std::to_string(chunk);
      std::vector<float> dh(size_t(N * C), NAN), dw = random_vector(size_t(V * C), 3);
      std::vector<float> dh_ref(size_t(N * C)), dw_ref = dw;
      std::vector<float> scratch(linear_cross_entropy_scratch_floats(chunk, V, C));
      int64_t n_valid = -1, n_valid_ref = -1;
      double loss = linear_cross_entropy(dh.data(), dw.data(), &n_valid, hidden.data(), weight.data(), labels.data(), N,
                                         C, V, softcap, 0.37f, chunk, scratch.data());
      double loss_ref = linear_cross_entropy_reference(dh_ref.data(), dw_ref.data(), &n_valid_ref, hidden.data(),
                                                       weight.data(), labels.data(), N, C, V, softcap, 0.37f);
      EXPECT_EQ(n_valid, N - 6 - 1 - 3) << tag;
      EXPECT_EQ(n_valid, n_valid_ref) << tag;
      EXPECT_NEAR(loss, loss_ref, 1e-5 * std::fabs(loss_ref)) << tag;
      expect_close(dh, dh_ref, 1e-5, "dhidden" + tag);
      expect_close(dw, dw_ref, 1e-5, "dweight" + tag);
      for (int64_t c = 0; c < C; ++c) EXPECT_EQ(dh[size_t(20 * C + c)], 0.0f) << "ignored row gets zero gradient";
      // The loss alone (no gradients) is the same.
      double loss_only = linear_cross_entropy(nullptr, nullptr, nullptr, hidden.data(), weight.data(), labels.data(),
                                              N, C, V, softcap, 1.0f, chunk, scratch.data());
      EXPECT_NEAR(loss_only, loss_ref, 1e-5 * std::fabs(loss_ref)) << tag;
    }
}

// A prompt-masked batch: short answer runs between long ignored prompts and padding. A chunk gathers
// tokens from several runs; the result is the reference's whatever the chunk size.
TEST(CrossEntropy, ChunksGatherShortAnswerRunsFromAcrossTheBatch) {
  const int64_t N = 60, C = 24, V = 211;
  auto hidden = random_vector(size_t(N * C), 11, -1, 1), weight = random_vector(size_t(V * C), 12, -0.5f, 0.5f);
  std::vector<int32_t> labels(size_t(N), kIgnoreIndex);
  for (int64_t i = 0; i < N; ++i)
    if (i % 10 >= 7) labels[size_t(i)] = int32_t((i * 31) % V);  // runs of 3 answer tokens every 10
  for (int64_t chunk : {int64_t(2), int64_t(5), int64_t(64)}) {
    const std::string tag = " chunk=" + std::to_string(chunk);
    std::vector<float> dh(size_t(N * C), NAN), dw(size_t(V * C), 0.0f), dh_ref(size_t(N * C)), dw_ref = dw;
    std::vector<float> scratch(linear_cross_entropy_scratch_floats(chunk, V, C));
    int64_t n_valid = -1;
    double loss = linear_cross_entropy(dh.data(), dw.data(), &n_valid, hidden.data(), weight.data(), labels.data(), N,
                                       C, V, 0.0f, 1.0f, chunk, scratch.data());
    double loss_ref = linear_cross_entropy_reference(dh_ref.data(), dw_ref.data(), nullptr, hidden.data(),
                                                     weight.data(), labels.data(), N, C, V, 0.0f, 1.0f);
    EXPECT_EQ(n_valid, 18) << tag;
    EXPECT_NEAR(loss, loss_ref, 1e-5 * std::fabs(loss_ref)) << tag;
    expect_close(dh, dh_ref, 1e-5, "dhidden" + tag);
    expect_close(dw, dw_ref, 1e-5, "dweight" + tag);
  }
}

TEST(CrossEntropy, AllIgnoredGivesZeroLossAndGradient) {
  const int64_t N = 4, C = 8, V = 16;
  auto hidden = random_vector(size_t(N * C), 4), weight = random_vector(size_t(V * C), 5);
  std::vector<int32_t> labels(static_cast<size_t>(N), kIgnoreIndex);
  std::vector<float> dh(size_t(N * C), 1.0f), dw(size_t(V * C), 0.0f), scratch(linear_cross_entropy_scratch_floats(2, V, C));
  int64_t n_valid = -1;
  EXPECT_EQ(linear_cross_entropy(dh.data(), dw.data(), &n_valid, hidden.data(), weight.data(), labels.data(), N, C, V,
                                 0.0f, 1.0f, 2, scratch.data()),
            0.0);
  EXPECT_EQ(n_valid, 0);
  for (float x : dh) EXPECT_EQ(x, 0.0f);
  for (float x : dw) EXPECT_EQ(x, 0.0f);
}

TEST(CrossEntropy, UniformLogitsGiveLogV) {
  const int64_t N = 3, C = 4, V = 50;
  std::vector<float> hidden(size_t(N * C), 0.0f), weight = random_vector(size_t(V * C), 6);
  std::vector<int32_t> labels = {0, 17, 49};
  std::vector<float> scratch(linear_cross_entropy_scratch_floats(2, V, C));
  double loss = linear_cross_entropy(nullptr, nullptr, nullptr, hidden.data(), weight.data(), labels.data(), N, C, V,
                                     0.0f, 1.0f, 2, scratch.data());
  EXPECT_NEAR(loss, 3 * std::log(50.0), 1e-5);
}

TEST(CrossEntropy, BackwardMatchesFiniteDifferences) {
  for (float softcap : {0.0f, 1.5f}) {
    const int64_t N = 9, C = 7, V = 23;
    auto hidden = random_vector(size_t(N * C), 7), weight = random_vector(size_t(V * C), 8);
    auto labels = labels_with_ignored(N, V);
    labels[2] = kIgnoreIndex;
    labels[3] = 5;
    std::vector<float> scratch(linear_cross_entropy_scratch_floats(4, V, C));
    auto loss = [&] {
      return linear_cross_entropy(nullptr, nullptr, nullptr, hidden.data(), weight.data(), labels.data(), N, C, V,
                                  softcap, 1.0f, 4, scratch.data());
    };
    std::vector<float> dh(size_t(N * C)), dw(size_t(V * C), 0.0f);
    linear_cross_entropy(dh.data(), dw.data(), nullptr, hidden.data(), weight.data(), labels.data(), N, C, V, softcap,
                         1.0f, 4, scratch.data());
    expect_gradient_matches_finite_differences(loss, hidden, dh, "dhidden softcap=" + std::to_string(softcap), 1e-2,
                                               2e-3, 63);
    expect_gradient_matches_finite_differences(loss, weight, dw, "dweight softcap=" + std::to_string(softcap), 1e-2,
                                               2e-3, 64);
  }
}

TEST(CrossEntropy, RejectsLabelsOutsideTheVocabulary) {
  const int64_t N = 2, C = 2, V = 3;
  std::vector<float> hidden(4), weight(6), scratch(linear_cross_entropy_scratch_floats(2, V, C));
  for (int32_t bad : {3, -1, -99}) {
    std::vector<int32_t> labels = {0, bad};
    EXPECT_THROW(linear_cross_entropy(nullptr, nullptr, nullptr, hidden.data(), weight.data(), labels.data(), N, C, V,
                                      0.0f, 1.0f, 2, scratch.data()),
                 ktune::Error);
  }
}
