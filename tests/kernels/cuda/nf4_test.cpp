// NF4 dequantisation on the GPU against the bitsandbytes layout computed here (the CPU nf4.cpp
// cannot be linked on the GPU machine: it needs oneDNN), and the frozen-base linear over NF4
// weights against a double loop over the dequantised (bf16-rounded) weights.
#include "cuda_test_harness.h"
#include "kernels/cuda/nf4.h"

namespace ktune {
namespace {

using cuda_test::from_device;
using cuda_test::random_floats;
using cuda_test::to_device;

// The 16 NF4 codes (design/formats-and-traps.md; kernels/cpu/nf4.cpp's kNf4Codes).
const float kCodes[16] = {-1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
                          -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
                          0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f, 0.33791524171829224f,
                          0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f, 1.0f};

std::vector<float> dequantize(const std::vector<uint8_t>& codes, const std::vector<float>& scales) {
  std::vector<float> x(codes.size() * 2);
  for (size_t i = 0; i < x.size(); ++i) {
    uint8_t byte = codes[i / 2];
    x[i] = kCodes[(i & 1) ? (byte & 0x0f) : (byte >> 4)] * scales[i / 64];  // first value: high nibble
  }
  return x;
}

std::vector<uint8_t> random_codes(size_t bytes, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> c(bytes);
  for (auto& b : c) b = uint8_t(rng());
  return c;
}

KTUNE_CUDA_TEST(Nf4DequantizeMatchesTheBitsandbytesLayout) {
  const int64_t n = 64 * 300;
  auto codes = random_codes(static_cast<size_t>(n / 2), 1);
  auto scales = random_floats(static_cast<size_t>(n / 64), 2, 0.01f, 2.0f);
  auto want = dequantize(codes, scales);
  auto d_codes = to_device(codes), d_scales = to_device(scales);
  cuda::DeviceBuffer d_x(static_cast<size_t>(n) * 4), d_xb(static_cast<size_t>(n) * 2);
  cuda::nf4_dequantize(d_x.as<float>(), d_codes.as<uint8_t>(), d_scales.as<float>(), n);
  cuda::nf4_dequantize(d_xb.as<bf16_t>(), d_codes.as<uint8_t>(), d_scales.as<float>(), n);
  auto got = from_device<float>(d_x, want.size());
  CHECK_CLOSE(got.data(), want.data(), n, 0.0, 0.0);  // one f32 multiply on both sides: exact
  auto got_b = cuda_test::from_bf16(from_device<bf16_t>(d_xb, want.size()));
  auto want_b = cuda_test::rounded_to_bf16(want);
  CHECK_CLOSE(got_b.data(), want_b.data(), n, 0.0, 0.0);  // then round to nearest even
}

KTUNE_CUDA_TEST(Nf4LinearForwardAndInputGradientMatchDequantizedGemm) {
  const int64_t N = 24, in = 128, out = 96;
  auto codes = random_codes(static_cast<size_t>(out * in / 2), 3);
  auto scales = random_floats(static_cast<size_t>(out * in / 64), 4, 0.05f, 0.5f);
  auto w = cuda_test::rounded_to_bf16(dequantize(codes, scales));  // what the GEMM multiplies
  auto x = cuda_test::rounded_to_bf16(random_floats(static_cast<size_t>(N * in), 5));
  auto dy = cuda_test::rounded_to_bf16(random_floats(static_cast<size_t>(N * out), 6));
  std::vector<float> y(static_cast<size_t>(N * out)), dx0 = random_floats(static_cast<size_t>(N * in), 7), dx = dx0;
  for (int64_t r = 0; r < N; ++r) {
    for (int64_t o = 0; o < out; ++o) {
      double acc = 0;
      for (int64_t i = 0; i < in; ++i) acc += double(x[size_t(r * in + i)]) * w[size_t(o * in + i)];
      y[size_t(r * out + o)] = float(acc);
    }
    for (int64_t i = 0; i < in; ++i) {
      double acc = 0;
      for (int64_t o = 0; o < out; ++o) acc += double(dy[size_t(r * out + o)]) * w[size_t(o * in + i)];
      dx[size_t(r * in + i)] += float(acc);  // accumulate_dx
    }
  }
  auto d_codes = to_device(codes), d_scales = to_device(scales);
  auto d_x = to_device(cuda_test::to_bf16(x)), d_dy = to_device(cuda_test::to_bf16(dy)), d_dx = to_device(dx0);
  cuda::DeviceBuffer d_y(y.size() * 4), scratch(static_cast<size_t>(out * in) * 2);
  cuda::GemmContext ctx;
  cuda::nf4_linear_forward(ctx, d_y.as<float>(), d_x.as<bf16_t>(), d_codes.as<uint8_t>(), d_scales.as<float>(), N, in,
                           out, scratch.as<bf16_t>());
  cuda::nf4_linear_backward_input(ctx, d_dx.as<float>(), d_dy.as<bf16_t>(), d_codes.as<uint8_t>(),
                                  d_scales.as<float>(), N, in, out, scratch.as<bf16_t>(), true);
  auto got_y = from_device<float>(d_y, y.size()), got_dx = from_device<float>(d_dx, dx.size());
  // bf16 products are exact in f32; f32 accumulation over <= 128 terms of size <= 0.5: 1e-5.
  CHECK_CLOSE(got_y.data(), y.data(), int64_t(y.size()), 1e-5, 1e-5);
  CHECK_CLOSE(got_dx.data(), dx.data(), int64_t(dx.size()), 1e-5, 1e-5);
}

}  // namespace
}  // namespace ktune
