#include "core/tensor.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

#include "core/error.h"

using namespace ktune;

TEST(Tensor, EmptyIsAlignedAndSized) {
  Tensor t = Tensor::empty({3, 5}, DType::BF16);
  EXPECT_EQ(t.numel(), 15);
  EXPECT_EQ(t.bytes(), 30u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw()) % kTensorAlignment, 0u);
  EXPECT_EQ(t.str(), "bf16(3, 5)");
}

TEST(Tensor, SliceRowsSharesStorage) {
  Tensor t = Tensor::zeros({4, 2});
  Tensor rows = t.slice_rows(1, 3);
  rows.f32()[0] = 7.0f;
  EXPECT_EQ(t.f32()[2], 7.0f);
  EXPECT_EQ(rows.shape(), Shape({2, 2}));
  EXPECT_THROW(t.slice_rows(3, 5), Error);
}

TEST(Tensor, ReshapeChecksElementCount) {
  Tensor t = Tensor::zeros({4, 2});
  EXPECT_EQ(t.reshape({8}).numel(), 8);
  EXPECT_THROW(t.reshape({3, 3}), Error);
}

TEST(Tensor, ConvertsBetweenF32AndBf16) {
  Tensor t = Tensor::empty({3});
  t.f32()[0] = 1.5f;
  t.f32()[1] = -2.25f;
  t.f32()[2] = 3.0e-3f;
  Tensor back = t.to(DType::BF16).to(DType::F32);
  EXPECT_EQ(back.f32()[0], 1.5f);
  EXPECT_EQ(back.f32()[1], -2.25f);
  EXPECT_NEAR(back.f32()[2], 3.0e-3f, 3.0e-3f / 128);
}

// To f16 and back, each element rounded as f32_to_f16 rounds it; from f16 to bf16.
TEST(Tensor, ConvertsToAndFromF16) {
  Tensor t = Tensor::empty({4});
  t.f32()[0] = 1.5f;
  t.f32()[1] = 1.0f + 1.0f / 4096;  // between halves 1 and 1 + 2^-10: nearer 1
  t.f32()[2] = 70000.0f;            // beyond the largest half
  t.f32()[3] = 1.0f + 3.0f / 2048;  // a tie between 1 + 2^-10 and 1 + 2^-9: the even one, 1 + 2^-9
  const Tensor half = t.to(DType::F16);
  ASSERT_EQ(half.dtype(), DType::F16);
  const Tensor back = half.to(DType::F32);
  EXPECT_EQ(back.f32()[0], 1.5f);
  EXPECT_EQ(back.f32()[1], 1.0f);
  EXPECT_EQ(back.f32()[2], std::numeric_limits<float>::infinity());
  EXPECT_EQ(back.f32()[3], 1.0f + 1.0f / 512);
  const Tensor narrow = half.to(DType::BF16);
  EXPECT_EQ(bf16_to_f32(narrow.bf16()[3]), 1.0f);  // 1 + 2^-9: nearer bf16 1 than 1 + 2^-7
}

TEST(Tensor, WrongDtypeAccessNamesTheTensor) {
  Tensor t = Tensor::zeros({2}, DType::BF16);
  try {
    t.f32();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bf16(2)"), std::string::npos);
  }
}
