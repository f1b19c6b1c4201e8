#include "core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
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

TEST(DType, NamesRoundTrip) {
  for (DType d : {DType::F32, DType::BF16, DType::F16, DType::NF4, DType::I32, DType::I64, DType::U8})
    EXPECT_EQ(dtype_from_name(dtype_name(d)), d);
  EXPECT_THROW(dtype_from_name("fp8"), std::exception);
}
