// Fused linear + cross-entropy: against the materialised reference (ignored labels, chunks that do
// not divide N, soft-capping, gradients on or off, a vocabulary of several backward blocks), against finite differences, and bad labels;
// the adapted head (LoRA/DoRA low-rank term, NF4 base) the same ways.
#include "kernels/cpu/cross_entropy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "gradient_check.h"
#include "kernels/cpu/nf4.h"

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

// A vocabulary of several of the backward's blocks (8192 rows each, and a part block): dhidden and
// dweight are each block's sum, with either one asked for alone, against the reference.
TEST(CrossEntropy, AVocabularyOfSeveralBackwardBlocksMatchesReference) {
  const int64_t N = 13, C = 8, V = 2 * 8192 + 517;
  auto hidden = random_vector(size_t(N * C), 21, -1, 1), weight = random_vector(size_t(V * C), 22, -0.5f, 0.5f);
  auto labels = labels_with_ignored(N, V);
  labels[8] = int32_t(V - 1);  // a label in the part block
  labels[9] = 8192;            // the second block's first row
  std::vector<float> dh_ref(size_t(N * C)), dw_ref = random_vector(size_t(V * C), 23);
  const std::vector<float> dw_start = dw_ref;
  const double loss_ref = linear_cross_entropy_reference(dh_ref.data(), dw_ref.data(), nullptr, hidden.data(),
                                                         weight.data(), labels.data(), N, C, V, 0.0f, 0.5f);
  const int64_t chunk = 3;
  std::vector<float> scratch(linear_cross_entropy_scratch_floats(chunk, V, C));
  for (int wanted = 0; wanted < 3; ++wanted) {  // both, dhidden alone, dweight alone
    const std::string tag = wanted == 0 ? " both" : wanted == 1 ? " dhidden alone" : " dweight alone";
    std::vector<float> dh(size_t(N * C), NAN), dw = dw_start;
    const double loss = linear_cross_entropy(wanted != 2 ? dh.data() : nullptr, wanted != 1 ? dw.data() : nullptr,
                                             nullptr, hidden.data(), weight.data(), labels.data(), N, C, V, 0.0f, 0.5f,
                                             chunk, scratch.data());
    EXPECT_NEAR(loss, loss_ref, 1e-5 * std::fabs(loss_ref)) << tag;
    if (wanted != 2) expect_close(dh, dh_ref, 1e-5, "dhidden" + tag);
    if (wanted != 1) expect_close(dw, dw_ref, 1e-5, "dweight" + tag);
    if (wanted == 1) {
      EXPECT_EQ(dw, dw_start) << "no weight gradient asked for" << tag;
    }
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

// ---- An adapted head (OutputHead: LoRA, DoRA, NF4 on lm_head) ----
// Reference: z = c ⊙ ([h, xa] · [W, s·B]ᵀ) is a plain fused loss over the augmented hidden
// [h, xa] (N, C+R) and weight c ⊙ [W, s·B] (V, C+R), so the materialised reference gives every
// gradient: dh and dxa are the augmented dhidden's columns, dB = s · c ⊙ dW_aug[:, C:], and
// dm = Σ_j dW_aug[v, j] · [W, s·B][v, j] / ‖·‖_v (the norm detached).
namespace {

struct HeadCase {
  int64_t N = 37, C = 24, V = 96, R = 3;
  float s = 1.5f;
  std::vector<float> hidden, weight, xa, b, m, norm, c;
  std::vector<int32_t> labels;
  explicit HeadCase(bool dora) {
    hidden = random_vector(size_t(N * C), 11, -1, 1);
    weight = random_vector(size_t(V * C), 12, -0.5f, 0.5f);
    xa = random_vector(size_t(N * R), 13, -1, 1);
    b = random_vector(size_t(V * R), 14, -0.3f, 0.3f);
    labels = labels_with_ignored(N, V);
    if (dora) {
      m = random_vector(size_t(V), 15, 0.5f, 1.5f);
      norm = random_vector(size_t(V), 16, 0.8f, 1.2f);
      c.resize(size_t(V));
      for (int64_t v = 0; v < V; ++v) c[size_t(v)] = m[size_t(v)] / norm[size_t(v)];
    }
  }
  OutputHead head(const float* w = nullptr) const {
    OutputHead hd;
    hd.weight = w ? w : weight.data();
    hd.rank = R;
    hd.lora_b = b.data();
    hd.lora_scale = s;
    hd.xa = xa.data();
    if (!c.empty()) {
      hd.dora = true;
      hd.dora_scale = c.data();
      hd.weight_norm = norm.data();
    }
    return hd;
  }
};

}  // namespace

TEST(CrossEntropy, AdaptedHeadMatchesTheAugmentedReference) {
  for (bool dora : {false, true})
    for (float softcap : {0.0f, 2.0f})
      for (int64_t chunk : {int64_t(1), int64_t(7), int64_t(1000)}) {
        const std::string tag = std::string(dora ? " dora" : " lora") + " softcap=" + std::to_string(softcap) +
                                " chunk=" + std::to_string(chunk);
        HeadCase k(dora);
        const int64_t N = k.N, C = k.C, V = k.V, R = k.R, CA = C + R;
        std::vector<float> h_aug(size_t(N * CA)), w_aug(size_t(V * CA)), w_unscaled(size_t(V * CA));
        for (int64_t n = 0; n < N; ++n)
          for (int64_t j = 0; j < CA; ++j)
            h_aug[size_t(n * CA + j)] = j < C ? k.hidden[size_t(n * C + j)] : k.xa[size_t(n * R + j - C)];
        for (int64_t v = 0; v < V; ++v)
          for (int64_t j = 0; j < CA; ++j) {
            w_unscaled[size_t(v * CA + j)] = j < C ? k.weight[size_t(v * C + j)] : k.s * k.b[size_t(v * R + j - C)];
            w_aug[size_t(v * CA + j)] = w_unscaled[size_t(v * CA + j)] * (dora ? k.c[size_t(v)] : 1.0f);
          }
        std::vector<float> dh_aug(size_t(N * CA)), dw_aug(size_t(V * CA), 0.0f);
        int64_t n_ref = -1;
        const double loss_ref = linear_cross_entropy_reference(dh_aug.data(), dw_aug.data(), &n_ref, h_aug.data(),
                                                               w_aug.data(), k.labels.data(), N, CA, V, softcap, 0.5f);

        OutputHead head = k.head();
        std::vector<float> dh(size_t(N * C), NAN), dxa(size_t(N * R), NAN), db(size_t(V * R), 0.25f),
            dm(size_t(V), 0.5f);
        head.dxa = dxa.data();
        head.dlora_b = db.data();
        if (dora) head.dmagnitude = dm.data();
        std::vector<float> scratch(linear_cross_entropy_scratch_floats(chunk, V, C, head));
        int64_t n_valid = -1;
        const double loss = linear_cross_entropy(dh.data(), nullptr, &n_valid, k.hidden.data(), head, k.labels.data(), N,
                                                 C, V, softcap, 0.5f, chunk, scratch.data());
        EXPECT_EQ(n_valid, n_ref) << tag;
        EXPECT_NEAR(loss, loss_ref, 1e-4 * std::fabs(loss_ref)) << tag;
        std::vector<float> dh_want(size_t(N * C)), dxa_want(size_t(N * R)), db_want(size_t(V * R)), dm_want(static_cast<size_t>(V));
        for (int64_t n = 0; n < N; ++n)
          for (int64_t j = 0; j < CA; ++j)
            (j < C ? dh_want[size_t(n * C + j)] : dxa_want[size_t(n * R + j - C)]) = dh_aug[size_t(n * CA + j)];
        for (int64_t v = 0; v < V; ++v) {
          const float cv = dora ? k.c[size_t(v)] : 1.0f;
          for (int64_t q = 0; q < R; ++q) db_want[size_t(v * R + q)] = 0.25f + k.s * cv * dw_aug[size_t(v * CA + C + q)];
          double sum = 0;
          for (int64_t j = 0; j < CA; ++j) sum += double(dw_aug[size_t(v * CA + j)]) * w_unscaled[size_t(v * CA + j)];
          dm_want[size_t(v)] = 0.5f + (dora ? float(sum / k.norm[size_t(v)]) : 0.0f);
        }
        expect_close(dh, dh_want, 1e-4, "dhidden" + tag);
        expect_close(dxa, dxa_want, 1e-4, "dxa" + tag);
        expect_close(db, db_want, 1e-4, "dB" + tag);
        if (dora) expect_close(dm, dm_want, 1e-4, "dm" + tag);
        if (dora) {  // DoRA's base is frozen: a weight gradient asked for is refused, not computed as LoRA's
          std::vector<float> dw(size_t(V * C));
          EXPECT_THROW(linear_cross_entropy(dh.data(), dw.data(), nullptr, k.hidden.data(), head, k.labels.data(), N, C,
                                            V, softcap, 0.5f, chunk, scratch.data()),
                       ktune::Error)
              << tag;
        }
      }
}

TEST(CrossEntropy, AdaptedHeadGradientsMatchFiniteDifferences) {
  for (bool dora : {false, true}) {
    HeadCase k(dora);
    const int64_t N = k.N, C = k.C, V = k.V, R = k.R;
    const float softcap = dora ? 0.0f : 3.0f;
    std::vector<float> scratch(linear_cross_entropy_scratch_floats(5, V, C, k.head()));
    auto loss = [&] {
      std::vector<float> c(k.c);  // DoRA: c = m / ‖·‖ with the norm held (detached)
      for (size_t v = 0; v < c.size(); ++v) c[v] = k.m[v] / k.norm[v];
      OutputHead head = k.head();
      if (dora) head.dora_scale = c.data();
      return linear_cross_entropy(nullptr, nullptr, nullptr, k.hidden.data(), head, k.labels.data(), N, C, V, softcap,
                                  1.0f, 5, scratch.data());
    };
    OutputHead head = k.head();
    std::vector<float> dh(size_t(N * C)), dxa(size_t(N * R)), db(size_t(V * R), 0.0f), dm(size_t(V), 0.0f);
    head.dxa = dxa.data();
    head.dlora_b = db.data();
    if (dora) head.dmagnitude = dm.data();
    linear_cross_entropy(dh.data(), nullptr, nullptr, k.hidden.data(), head, k.labels.data(), N, C, V, softcap, 1.0f, 5,
                         scratch.data());
    const std::string tag = dora ? " (dora)" : " (lora, softcap)";
    expect_gradient_matches_finite_differences(loss, k.hidden, dh, "dhidden" + tag);
    expect_gradient_matches_finite_differences(loss, k.xa, dxa, "dxa" + tag);
    expect_gradient_matches_finite_differences(loss, k.b, db, "dB" + tag);
    if (dora) expect_gradient_matches_finite_differences(loss, k.m, dm, "dm" + tag);
  }
}

TEST(CrossEntropy, Nf4HeadEqualsTheF32HeadOnItsDequantisedWeight) {
  HeadCase k(true);
  const int64_t N = k.N, C = k.C, V = k.V, R = k.R;
  std::vector<uint8_t> codes(size_t(V * C / 2));
  Nf4Scales scales;
  std::vector<float> dequantised(size_t(V * C));
  nf4_quantize(codes.data(), scales, k.weight.data(), V * C, Nf4Arithmetic::kBf16);
  nf4_dequantize(dequantised.data(), codes.data(), scales, V * C, Nf4Arithmetic::kBf16);
  std::vector<float> dh_a(size_t(N * C)), dh_b(size_t(N * C)), dxa_a(size_t(N * R)), dxa_b(size_t(N * R));
  std::vector<float> db_a(size_t(V * R), 0.0f), db_b(size_t(V * R), 0.0f), dm_a(size_t(V), 0.0f), dm_b(size_t(V), 0.0f);
  OutputHead f32 = k.head(dequantised.data());
  f32.dxa = dxa_a.data(), f32.dlora_b = db_a.data(), f32.dmagnitude = dm_a.data();
  OutputHead nf4 = k.head();
  nf4.weight = nullptr, nf4.nf4_codes = codes.data(), nf4.nf4_scales = &scales;
  nf4.dxa = dxa_b.data(), nf4.dlora_b = db_b.data(), nf4.dmagnitude = dm_b.data();
  std::vector<float> scratch_a(linear_cross_entropy_scratch_floats(8, V, C, f32)),
      scratch_b(linear_cross_entropy_scratch_floats(8, V, C, nf4));
  EXPECT_GT(scratch_b.size(), scratch_a.size());  // the NF4 block of rows
  {  // never the whole weight: at a head of 32000 x 512, a block of rows
    OutputHead big_f32, big_nf4;
    big_nf4.nf4_codes = codes.data();
    const size_t extra = linear_cross_entropy_scratch_floats(8, 32000, 512, big_nf4) -
                         linear_cross_entropy_scratch_floats(8, 32000, 512, big_f32);
    EXPECT_GT(extra, 0u);
    EXPECT_LE(extra, size_t(32000 * 512 / 8));
  }
  const double a = linear_cross_entropy(dh_a.data(), nullptr, nullptr, k.hidden.data(), f32, k.labels.data(), N, C, V,
                                        0.0f, 1.0f, 8, scratch_a.data());
  const double b = linear_cross_entropy(dh_b.data(), nullptr, nullptr, k.hidden.data(), nf4, k.labels.data(), N, C, V,
                                        0.0f, 1.0f, 8, scratch_b.data());
  EXPECT_NEAR(a, b, 1e-5 * std::fabs(a));
  expect_close(dh_b, dh_a, 1e-5, "dhidden");
  expect_close(dxa_b, dxa_a, 1e-5, "dxa");
  expect_close(db_b, db_a, 1e-5, "dB");
  expect_close(dm_b, dm_a, 1e-5, "dm");
  std::vector<float> dw(size_t(V * C));
  EXPECT_THROW(linear_cross_entropy(dh_b.data(), dw.data(), nullptr, k.hidden.data(), nf4, k.labels.data(), N, C, V,
                                    0.0f, 1.0f, 8, scratch_b.data()),
               ktune::Error);
}

TEST(CrossEntropy, DoraHeadWithDroppedRowsMatchesTheAugmentedReference) {
  // PEFT's DoRA with dropout: z = h Wᵀ + (c − 1) ⊙ h' Wᵀ + c ⊙ s · xa Bᵀ, the plain fused loss over
  // [h, h', xa] (N, 2C+R) and [W, (c − 1) ⊙ W, c ⊙ s·B] (V, 2C+R).
  for (int64_t chunk : {int64_t(1), int64_t(7), int64_t(1000)}) {
    HeadCase k(true);
    const int64_t N = k.N, C = k.C, V = k.V, R = k.R, CA = 2 * C + R;
    std::vector<float> dropped = random_vector(size_t(N * C), 17, -1, 1);
    std::vector<float> h_aug(size_t(N * CA)), w_aug(size_t(V * CA)), w_unscaled(size_t(V * CA));
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < CA; ++j)
        h_aug[size_t(n * CA + j)] = j < C ? k.hidden[size_t(n * C + j)]
                                   : j < 2 * C ? dropped[size_t(n * C + j - C)] : k.xa[size_t(n * R + j - 2 * C)];
    for (int64_t v = 0; v < V; ++v) {
      const float c = k.c[size_t(v)];
      for (int64_t j = 0; j < CA; ++j) {
        const float u = j < 2 * C ? k.weight[size_t(v * C + j % C)] : k.s * k.b[size_t(v * R + j - 2 * C)];
        w_unscaled[size_t(v * CA + j)] = u;
        w_aug[size_t(v * CA + j)] = j < C ? u : j < 2 * C ? (c - 1.0f) * u : c * u;
      }
    }
    std::vector<float> dh_aug(size_t(N * CA)), dw_aug(size_t(V * CA), 0.0f);
    const double loss_ref = linear_cross_entropy_reference(dh_aug.data(), dw_aug.data(), nullptr, h_aug.data(),
                                                           w_aug.data(), k.labels.data(), N, CA, V, 0.0f, 1.0f);
    OutputHead head = k.head();
    std::vector<float> dh(size_t(N * C), NAN), ddropped(size_t(N * C), NAN), dxa(size_t(N * R), NAN),
        db(size_t(V * R), 0.0f), dm(static_cast<size_t>(V), 0.0f);
    head.dropped_hidden = dropped.data();
    head.ddropped_hidden = ddropped.data();
    head.dxa = dxa.data();
    head.dlora_b = db.data();
    head.dmagnitude = dm.data();
    std::vector<float> scratch(linear_cross_entropy_scratch_floats(chunk, V, C, head));
    const double loss = linear_cross_entropy(dh.data(), nullptr, nullptr, k.hidden.data(), head, k.labels.data(), N, C, V,
                                             0.0f, 1.0f, chunk, scratch.data());
    const std::string tag = " chunk=" + std::to_string(chunk);
    EXPECT_NEAR(loss, loss_ref, 1e-4 * std::fabs(loss_ref)) << tag;
    std::vector<float> dh_want(size_t(N * C)), dd_want(size_t(N * C)), dxa_want(size_t(N * R));
    std::vector<float> db_want(size_t(V * R)), dm_want(static_cast<size_t>(V));
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < CA; ++j) {
        const float g = dh_aug[size_t(n * CA + j)];
        if (j < C) dh_want[size_t(n * C + j)] = g;
        else if (j < 2 * C) dd_want[size_t(n * C + j - C)] = g;
        else dxa_want[size_t(n * R + j - 2 * C)] = g;
      }
    for (int64_t v = 0; v < V; ++v) {
      for (int64_t q = 0; q < R; ++q)
        db_want[size_t(v * R + q)] = k.s * k.c[size_t(v)] * dw_aug[size_t(v * CA + 2 * C + q)];
      double sum = 0;  // ∂z/∂c = h' W + s xa B: the h' and xa blocks
      for (int64_t j = C; j < CA; ++j) sum += double(dw_aug[size_t(v * CA + j)]) * w_unscaled[size_t(v * CA + j)];
      dm_want[size_t(v)] = float(sum / k.norm[size_t(v)]);
    }
    expect_close(dh, dh_want, 1e-4, "dhidden" + tag);
    expect_close(ddropped, dd_want, 1e-4, "ddropped_hidden" + tag);
    expect_close(dxa, dxa_want, 1e-4, "dxa" + tag);
    expect_close(db, db_want, 1e-4, "dB" + tag);
    expect_close(dm, dm_want, 1e-4, "dm" + tag);
  }
}

TEST(CrossEntropy, DoraHeadWithDroppedRowsGradientsMatchFiniteDifferences) {
  HeadCase k(true);
  const int64_t N = k.N, C = k.C, V = k.V, R = k.R;
  std::vector<float> dropped = random_vector(size_t(N * C), 18, -1, 1);
  std::vector<float> scratch;
  auto loss = [&] {
    std::vector<float> c(k.c);
    for (size_t v = 0; v < c.size(); ++v) c[v] = k.m[v] / k.norm[v];
    OutputHead head = k.head();
    head.dora_scale = c.data();
    head.dropped_hidden = dropped.data();
    scratch.resize(linear_cross_entropy_scratch_floats(5, V, C, head));
    return linear_cross_entropy(nullptr, nullptr, nullptr, k.hidden.data(), head, k.labels.data(), N, C, V, 0.0f, 1.0f,
                                5, scratch.data());
  };
  OutputHead head = k.head();
  std::vector<float> dh(size_t(N * C)), ddropped(size_t(N * C)), dxa(size_t(N * R)), db(size_t(V * R), 0.0f),
      dm(static_cast<size_t>(V), 0.0f);
  head.dropped_hidden = dropped.data();
  head.ddropped_hidden = ddropped.data();
  head.dxa = dxa.data();
  head.dlora_b = db.data();
  head.dmagnitude = dm.data();
  scratch.resize(linear_cross_entropy_scratch_floats(5, V, C, head));
  linear_cross_entropy(dh.data(), nullptr, nullptr, k.hidden.data(), head, k.labels.data(), N, C, V, 0.0f, 1.0f, 5,
                       scratch.data());
  expect_gradient_matches_finite_differences(loss, k.hidden, dh, "dhidden");
  expect_gradient_matches_finite_differences(loss, dropped, ddropped, "ddropped_hidden");
  expect_gradient_matches_finite_differences(loss, k.xa, dxa, "dxa");
  expect_gradient_matches_finite_differences(loss, k.b, db, "dB");
  expect_gradient_matches_finite_differences(loss, k.m, dm, "dm");
}
