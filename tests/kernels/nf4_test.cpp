// NF4: the code table as QLoRA/bitsandbytes defines it, the nibble order, nearest-code quantisation,
// round-trip error bounds, and the linear ops against a linear layer on the dequantised weight.
#include "kernels/cpu/nf4.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "gradient_check.h"
#include "kernels/cpu/linear.h"

using namespace ktune::cpu;
using namespace ktune::cpu::testing;

TEST(Nf4, CodeTableIsBitsandbytesExactly) {
  // bitsandbytes.functional.get_4bit_type("nf4") (as f32), the values QLoRA's paper derives.
  const double expected[16] = {-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
                               -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
                               0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
                               0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0};
  for (int i = 0; i < 16; ++i) EXPECT_EQ(kNf4Codes[i], float(expected[i])) << i;
}

TEST(Nf4, PacksTheFirstValueInTheHighNibble) {
  std::vector<float> x(64, 0.0f);
  x[0] = -2.0f;  // absmax: code 0 (-1.0)
  x[1] = 2.0f;   // code 15 (+1.0)
  x[2] = 0.0f;   // code 7
  x[3] = 0.16f;  // 0.08 of absmax... nearest of 0.0796 (code 8)
  std::vector<uint8_t> codes(32);
  float scale;
  nf4_quantize(codes.data(), &scale, x.data(), 64);
  EXPECT_EQ(scale, 2.0f);
  EXPECT_EQ(codes[0], 0x0f);
  EXPECT_EQ(codes[1], 0x78);
  EXPECT_EQ(codes[2], 0x77);
}

// nf4_quantize counts each block's values against the midpoints a midpoint at a time across the
// block (vectorised); the codes are those of counting them a value at a time in f32 (x * (1/absmax)
// against each midpoint), bit for bit: random blocks, values exactly on the midpoints (scaled back by
// the absmax), signed zeros, an all-zero block, and a block under a negative absmax.
TEST(Nf4, TheBlockwiseQuantiserGivesTheCodesOfAValueAtATime) {
  float midpoints[15];
  for (int i = 0; i < 15; ++i) midpoints[i] = 0.5f * (kNf4Codes[i] + kNf4Codes[i + 1]);
  const int64_t blocks = 203, n = 64 * blocks;
  auto x = random_vector(size_t(n), 7, -2, 2);
  for (int64_t i = 0; i < 64; ++i) x[size_t(64 * 3 + i)] = 0.0f;
  for (int64_t i = 0; i < 64; ++i) x[size_t(64 * 4 + i)] = (i % 2 ? -0.0f : 0.0f);
  x[size_t(64 * 4 + 5)] = 1e-30f;
  for (int64_t b = 5; b < 9; ++b) {  // on the midpoints, a block's absmax 1.5 (or -1.5) at its first value
    x[size_t(64 * b)] = b % 2 ? -1.5f : 1.5f;
    for (int64_t i = 1; i < 64; ++i) x[size_t(64 * b + i)] = midpoints[(i - 1) % 15] * 1.5f * (i > 32 ? -1.0f : 1.0f);
  }
  std::vector<uint8_t> codes(size_t(n / 2));
  std::vector<float> scales(static_cast<size_t>(blocks));
  nf4_quantize(codes.data(), scales.data(), x.data(), n);
  for (int64_t b = 0; b < blocks; ++b) {
    float absmax = 0.0f;
    for (int64_t i = 0; i < 64; ++i) absmax = std::max(absmax, std::fabs(x[size_t(64 * b + i)]));
    ASSERT_EQ(scales[size_t(b)], absmax) << "block " << b;
    const float inv = absmax > 0.0f ? 1.0f / absmax : 0.0f;
    for (int64_t i = 0; i < 64; ++i) {
      const int64_t e = 64 * b + i;
      int want = 0;
      for (int m = 0; m < 15; ++m) want += x[size_t(e)] * inv > midpoints[m];
      const int got = e % 2 ? codes[size_t(e / 2)] & 15 : codes[size_t(e / 2)] >> 4;
      ASSERT_EQ(got, want) << "value " << e << " (" << x[size_t(e)] << ")";
    }
  }
}

TEST(Nf4, QuantisationPicksTheNearestCodeAndMatchesReference) {
  const int64_t n = 64 * 301;
  auto x = random_vector(size_t(n), 1, -3, 3);
  for (int64_t i = 0; i < 64; ++i) x[size_t(64 * 5 + i)] = 0.0f;  // an all-zero block
  std::vector<uint8_t> codes(size_t(n / 2)), codes_ref(size_t(n / 2));
  std::vector<float> scales(size_t(n / 64)), scales_ref(size_t(n / 64));
  nf4_quantize(codes.data(), scales.data(), x.data(), n);
  nf4_quantize_reference(codes_ref.data(), scales_ref.data(), x.data(), n);
  EXPECT_EQ(scales, scales_ref);
  int64_t mismatches = 0;
  for (int64_t i = 0; i < n; ++i) {
    int a = (i & 1) ? codes[size_t(i / 2)] & 15 : codes[size_t(i / 2)] >> 4;
    int b = (i & 1) ? codes_ref[size_t(i / 2)] & 15 : codes_ref[size_t(i / 2)] >> 4;
    if (a != b) {
      // allowed only exactly at a midpoint (f32 x*inv vs double x/absmax)
      double v = double(x[size_t(i)]) / scales[size_t(i / 64)];
      EXPECT_NEAR(std::fabs(v - kNf4Codes[a]), std::fabs(v - kNf4Codes[b]), 1e-6) << i;
      ++mismatches;
    }
  }
  EXPECT_LE(mismatches, 2);
  double widest_gap = 0;
  for (int c = 0; c < 15; ++c) widest_gap = std::max(widest_gap, double(kNf4Codes[c + 1]) - kNf4Codes[c]);
  EXPECT_NEAR(widest_gap, 1.0 - 0.6961928009986877, 1e-7);
  std::vector<float> back(static_cast<size_t>(n));
  nf4_dequantize(back.data(), codes.data(), scales.data(), n);
  for (int64_t b = 0; b < n / 64; ++b) {
    for (int64_t i = b * 64; i < (b + 1) * 64; ++i) {
      const float s = scales[size_t(b)];
      // The nearest code: no other code is closer (up to rounding), and the error at most half the
      // widest gap between neighbouring codes (-0.696... to -1.0) times the block's absmax.
      double err = std::fabs(double(back[size_t(i)]) - x[size_t(i)]);
      for (int c = 0; c < 16; ++c) EXPECT_LE(err, std::fabs(double(kNf4Codes[c]) * s - x[size_t(i)]) + 1e-6 * s) << i;
      EXPECT_LE(err, 0.5 * widest_gap * s + 1e-6) << i;
      if (std::fabs(x[size_t(i)]) == s) {
        EXPECT_EQ(back[size_t(i)], x[size_t(i)]) << "absmax is exact";
      }
    }
  }
  for (int64_t i = 64 * 5; i < 64 * 6; ++i) EXPECT_EQ(back[size_t(i)], 0.0f);
}

TEST(Nf4, DequantiseRangeHandlesUnalignedBounds) {
  const int64_t n = 256;
  auto x = random_vector(size_t(n), 2);
  std::vector<uint8_t> codes(size_t(n / 2));
  std::vector<float> scales(size_t(n / 64)), all(static_cast<size_t>(n)), part(50);
  nf4_quantize(codes.data(), scales.data(), x.data(), n);
  nf4_dequantize(all.data(), codes.data(), scales.data(), n);
  nf4_dequantize_range(part.data(), codes.data(), scales.data(), 61, 111);
  for (int64_t i = 0; i < 50; ++i) EXPECT_EQ(part[size_t(i)], all[size_t(61 + i)]);
}

TEST(Nf4, RejectsPartialBlocks) {
  std::vector<float> x(65);
  std::vector<uint8_t> codes(40);
  std::vector<float> scales(2);
  EXPECT_THROW(nf4_quantize(codes.data(), scales.data(), x.data(), 65), ktune::Error);
}

TEST(Nf4, LinearOpsMatchLinearOnTheDequantisedWeight) {
  // in = 96 is not a multiple of 64: blocks straddle rows. out large enough for several row blocks.
  for (auto [N, in, out] : {std::tuple<int64_t, int64_t, int64_t>{13, 96, 40}, {5, 3008, 300}}) {
    auto w = random_vector(size_t(out * in), 3);
    std::vector<uint8_t> codes(size_t(out * in / 2));
    std::vector<float> scales(size_t(out * in / 64)), wd(size_t(out * in));
    nf4_quantize(codes.data(), scales.data(), w.data(), out * in);
    nf4_dequantize(wd.data(), codes.data(), scales.data(), out * in);
    auto x = random_vector(size_t(N * in), 4), dy = random_vector(size_t(N * out), 5);
    std::vector<float> scratch(nf4_linear_scratch_floats(in, out));
    EXPECT_LT(scratch.size(), size_t(out * in) + 1);
    std::vector<float> y(size_t(N * out)), y_ref(size_t(N * out));
    nf4_linear_forward(y.data(), x.data(), codes.data(), scales.data(), N, in, out, scratch.data());
    linear_forward_reference(y_ref.data(), x.data(), wd.data(), nullptr, N, in, out);
    expect_close(y, y_ref, 1e-5, "nf4 forward");
    for (bool accumulate : {false, true}) {
      auto dx = random_vector(size_t(N * in), 6);
      auto dx_ref = dx;
      nf4_linear_backward_input(dx.data(), dy.data(), codes.data(), scales.data(), N, in, out, scratch.data(),
                                accumulate);
      linear_backward_reference(dx_ref.data(), nullptr, nullptr, dy.data(), x.data(), wd.data(), N, in, out,
                                accumulate);
      expect_close(dx, dx_ref, 1e-5, "nf4 backward input");
    }
  }
}

TEST(Nf4, ScratchIsABlockOfRowsNotTheWholeWeight) {
  EXPECT_LT(nf4_linear_scratch_floats(4096, 14336), size_t(4096) * 14336 / 8);
}
