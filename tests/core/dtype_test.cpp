#include "core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

using namespace ktune;

TEST(DType, Bf16RoundsToNearestEven) {
  // 1 + 2^-8 lies exactly between bf16 1.0 and 1 + 2^-7: ties go to the even mantissa (1.0).
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  // 1 + 3*2^-8 lies between 1 + 2^-7 (odd) and 1 + 2^-6 (even): ties to 1 + 2^-6.
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8))), 1.0f + std::ldexp(1.0f, -6));
  // Just above the tie rounds up.
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20))), 1.0f + std::ldexp(1.0f, -7));
}

TEST(DType, Bf16KeepsNaNAndInfinity) {
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::infinity())), std::numeric_limits<float>::infinity());
}

TEST(DType, Bf16StochasticRoundingIsUnbiased) {
  const float x = 1.0f + std::ldexp(1.0f, -9);  // a quarter of the way from 1.0 to the next bf16
  double sum = 0;
  const int n = 1 << 16;
  for (int i = 0; i < n; ++i) sum += bf16_to_f32(f32_to_bf16_stochastic(x, uint32_t(i)));
  EXPECT_NEAR(sum / n, x, 1e-6);
}

TEST(DType, F16Decodes) {
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(f16_to_f32(0x7c00), std::numeric_limits<float>::infinity());
}

// The reference below is the compiler's own half type (GCC 12 and Clang 15 on x86-64 have it).
#if defined(__FLT16_MAX__)
// Every half widens as the compiler's _Float16 does, and narrows back to itself.
TEST(DType, EveryF16WidensAndNarrowsBackToItself) {
  for (uint32_t h = 0; h <= 0xffffu; ++h) {
    const uint16_t half = uint16_t(h);
    _Float16 reference;
    std::memcpy(&reference, &half, sizeof half);
    const float wide = f16_to_f32(half);
    if (std::isnan(float(reference))) {
      EXPECT_TRUE(std::isnan(wide)) << std::hex << h;
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(wide)))) << std::hex << h;
      continue;
    }
    ASSERT_EQ(wide, float(reference)) << std::hex << h;
    ASSERT_EQ(f32_to_f16(wide), half) << std::hex << h;
  }
}

// The f32 -> f16 rounding against the compiler's (round to nearest even, subnormals, overflow):
// every tie between two neighbouring halves and a point either side of it, then random f32s.
TEST(DType, F32NarrowsToF16AsTheCompilersHalfDoes) {
  auto expect_as_compiler = [](float f) {
    const _Float16 reference = static_cast<_Float16>(f);
    uint16_t want;
    std::memcpy(&want, &reference, sizeof want);
    ASSERT_EQ(f32_to_f16(f), want) << f << " (bits " << std::hex << [&] { uint32_t b; std::memcpy(&b, &f, 4); return b; }() << ")";
  };
  for (uint32_t h = 0; h < 0x7c00u; ++h) {  // every finite positive half and the next one up
    const float low = f16_to_f32(uint16_t(h)), high = h + 1 < 0x7c00u ? f16_to_f32(uint16_t(h + 1)) : 65536.0f;
    const float tie = low + (high - low) / 2;  // exact in f32
    for (float f : {tie, std::nextafter(tie, 0.0f), std::nextafter(tie, 1e9f)}) {
      expect_as_compiler(f);
      expect_as_compiler(-f);
    }
  }
  expect_as_compiler(1e-30f);
  expect_as_compiler(std::numeric_limits<float>::infinity());
  expect_as_compiler(-std::numeric_limits<float>::max());
  uint64_t state = 0x9e3779b97f4a7c15ull;
  for (int i = 0; i < 1000000; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const uint32_t bits = uint32_t(state >> 32);
    float f;
    std::memcpy(&f, &bits, sizeof f);
    if (!std::isnan(f)) expect_as_compiler(f);
  }
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(std::numeric_limits<float>::quiet_NaN()))));
}
#else
TEST(DType, F32NarrowsToF16AsTheCompilersHalfDoes) { GTEST_SKIP() << "this compiler has no _Float16 to check against"; }
#endif

TEST(DType, NamesRoundTrip) {
  for (DType d : {DType::F32, DType::BF16, DType::F16, DType::NF4, DType::I32, DType::I64, DType::U8})
    EXPECT_EQ(dtype_from_name(dtype_name(d)), d);
  EXPECT_THROW(dtype_from_name("fp8"), std::exception);
}
