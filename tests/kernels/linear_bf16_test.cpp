// The bf16 operands of a bf16-weight projection: rounding f32 into bf16 (and into a bf16 sum) as the
// scalar f32_to_bf16 does, and the three bf16 linear GEMMs (forward, input gradient, weight gradient
// rows) and decoding's widening product against the f32 references run on the same bf16 values
// widened: the operands are equal, so only the order of the f32 accumulation differs. And the
// KTUNE_BF16_GEMM switch.
#include "kernels/cpu/linear.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "bf16_values.h"
#include "gradient_check.h"
#include "kernels/cpu/bf16_rounding.h"
#include "kernels/cpu/gemm.h"

using namespace ktune;
using namespace ktune::cpu;
using namespace ktune::cpu::testing;

TEST(Bf16Rounding, RoundAndAddedSumMatchTheScalarRoundingIncludingTiesAndSpecials) {
  std::vector<float> x = random_vector(100003, 1, -3, 3);
  x[0] = 1.0f + std::ldexp(1.0f, -8);                    // a tie: rounds to even (1.0)
  x[1] = 1.0f + 3 * std::ldexp(1.0f, -8);                // a tie: rounds to even (up)
  x[2] = INFINITY, x[3] = -INFINITY, x[4] = NAN, x[5] = 0.0f, x[6] = -0.0f, x[7] = 1e-40f;  // specials, subnormal
  std::vector<bf16_t> r(x.size());
  round_to_bf16(r.data(), x.data(), int64_t(x.size()));
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(r[i], f32_to_bf16(x[i])) << i;
  EXPECT_EQ(bf16_to_f32(r[0]), 1.0f);
  EXPECT_EQ(bf16_to_f32(r[1]), 1.0f + 4 * std::ldexp(1.0f, -8));

  std::vector<float> g = random_vector(x.size(), 2, -1e-2f, 1e-2f);
  std::vector<bf16_t> sum = r;
  add_rounded_to_bf16(sum.data(), g.data(), int64_t(g.size()));
  for (size_t i = 8; i < x.size(); ++i) ASSERT_EQ(sum[i], f32_to_bf16(bf16_to_f32(r[i]) + g[i])) << i;
}

TEST(LinearBf16, ForwardAndBothGradientsMatchTheF32ReferenceOnTheSameBf16Values) {
  const int64_t N = 37, in = 83, out = 59;
  auto x16 = to_bf16(random_vector(size_t(N * in), 3)), w16 = to_bf16(random_vector(size_t(out * in), 4, -0.5f, 0.5f));
  auto b16 = to_bf16(random_vector(size_t(out), 5)), dy16 = to_bf16(random_vector(size_t(N * out), 6));
  auto x = widened(x16), w = widened(w16), b = widened(b16), dy = widened(dy16);
  for (bool bias : {false, true}) {
    std::vector<float> y(size_t(N * out), NAN), y_ref(y.size());
    linear_forward_bf16(y.data(), x16.data(), w16.data(), bias ? b16.data() : nullptr, N, in, out);
    linear_forward_reference(y_ref.data(), x.data(), w.data(), bias ? b.data() : nullptr, N, in, out);
    expect_close(y, y_ref, 1e-5, bias ? "y (bias)" : "y");
  }
  for (bool accumulate : {false, true}) {
    std::vector<float> dx = random_vector(size_t(N * in), 7), dx_ref = dx;
    if (!accumulate) std::fill(dx.begin(), dx.end(), NAN);
    linear_backward_input_bf16(dx.data(), dy16.data(), w16.data(), N, in, out, accumulate);
    linear_backward_reference(dx_ref.data(), nullptr, nullptr, dy.data(), x.data(), w.data(), N, in, out, accumulate);
    expect_close(dx, dx_ref, 1e-5, accumulate ? "dx (accumulated)" : "dx");
  }
  // dW rows in blocks that do not divide out, overwritten (beta 0) and accumulated (beta 1).
  std::vector<float> dw_ref(size_t(out * in), 0.0f);
  linear_backward_reference(nullptr, dw_ref.data(), nullptr, dy.data(), x.data(), w.data(), N, in, out, false);
  for (float beta : {0.0f, 1.0f}) {
    std::vector<float> dw(size_t(out * in), beta == 0.0f ? NAN : 0.0f);
    const int64_t block = 16;
    for (int64_t o0 = 0; o0 < out; o0 += block) {
      const int64_t rows = std::min(block, out - o0);
      linear_backward_weight_bf16(dw.data() + o0 * in, dy16.data(), x16.data(), N, in, out, o0, rows, beta);
    }
    expect_close(dw, dw_ref, 1e-5, beta == 0.0f ? "dW blocks" : "dW blocks accumulated");
  }
}

// Decoding's product on a bf16 weight (each row widened as it is read, x in f32) against the f32
// reference GEMM on the widened weight and bias: one token, a few, the most it takes, odd sizes.
TEST(LinearBf16, WideningForwardOfFewRowsMatchesTheReferenceOnTheWidenedWeight) {
  for (int64_t N : {int64_t(1), int64_t(3), kWideningRowsMax}) {
    for (bool with_bias : {false, true}) {
      const int64_t in = 67, out = 45;
      const auto x = random_vector(size_t(N * in), 31, -2, 2);
      const auto w16 = to_bf16(random_vector(size_t(out * in), 32));
      const auto b16 = to_bf16(random_vector(size_t(out), 33));
      std::vector<float> y(size_t(N * out), NAN), expected(size_t(N * out));
      linear_forward_widening_bf16(y.data(), x.data(), w16.data(), with_bias ? b16.data() : nullptr, N, in, out);
      gemm_reference(false, true, N, out, in, 1.0f, x.data(), widened(w16).data(), 0.0f, expected.data());
      if (with_bias)
        for (int64_t n = 0; n < N; ++n)
          for (int64_t o = 0; o < out; ++o) expected[size_t(n * out + o)] += bf16_to_f32(b16[size_t(o)]);
      expect_close(y, expected, 1e-5, "N=" + std::to_string(N) + (with_bias ? " with bias" : ""), 1e-6);
    }
  }
}

TEST(Bf16GemmChoice, KtuneBf16GemmForcesWidenOrBf16ElseTheCpuDecidesAndRefusesOtherValues) {
  const char* before = std::getenv("KTUNE_BF16_GEMM");
  const std::string saved = before ? before : "";
  unsetenv("KTUNE_BF16_GEMM");
  EXPECT_EQ(bf16_weights_use_bf16_gemm(), gemm_bf16_native());
  setenv("KTUNE_BF16_GEMM", "widen", 1);
  EXPECT_FALSE(bf16_weights_use_bf16_gemm());
  setenv("KTUNE_BF16_GEMM", "bf16", 1);
  EXPECT_TRUE(bf16_weights_use_bf16_gemm());
  setenv("KTUNE_BF16_GEMM", "f32", 1);
  EXPECT_THROW(bf16_weights_use_bf16_gemm(), Error);
  if (saved.empty()) unsetenv("KTUNE_BF16_GEMM");
  else setenv("KTUNE_BF16_GEMM", saved.c_str(), 1);
}
