// NF4 dequantisation on the GPU against torchao's layout computed here (the CPU nf4.cpp
// cannot be linked on the GPU machine: it needs oneDNN), and the frozen-base linear over NF4
// weights against a double loop over the dequantised (bf16-rounded) weights; the GEMM with the
// dequantisation fused in (nf4_gemm.h) against the same loops and against the plain path.
#include "core/error.h"
#include "cuda_test_harness.h"
#include "kernels/cuda/nf4.h"
#include "kernels/cuda/nf4_gemm.h"

namespace ktune {
namespace {

using cuda_test::from_device;
using cuda_test::random_floats;
using cuda_test::to_device;

// torchao's 16 NF4 codes (torchao.dtypes.nf4tensor: -1.0, -0.6962, ..., 0.7230, 1.0) as a bf16 tensor
// holds them: the table a bf16 weight is dequantised with (kernels/cpu/nf4.h's kNf4CodesBf16).
const float kCodes[16] = {-1.0f,           -0.6953125f,    -0.5234375f, -0.39453125f, -0.28515625f, -0.1845703125f,
                          -0.09130859375f, 0.0f,           0.07958984375f, 0.1611328125f, 0.24609375f, 0.337890625f,
                          0.44140625f,     0.5625f,        0.72265625f,    1.0f};

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

KTUNE_CUDA_TEST(Nf4DequantizeMatchesTorchaosLayout) {
  const int64_t n = 64 * 300;
  auto codes = random_codes(static_cast<size_t>(n / 2), 1);
  auto scales = cuda_test::rounded_to_bf16(random_floats(static_cast<size_t>(n / 64), 2, 0.01f, 2.0f));  // bf16, as held
  auto want = dequantize(codes, scales);
  auto d_codes = to_device(codes), d_scales = to_device(cuda_test::to_bf16(scales));
  cuda::DeviceBuffer d_x(static_cast<size_t>(n) * 4), d_xb(static_cast<size_t>(n) * 2);
  cuda::nf4_dequantize(d_x.as<float>(), d_codes.as<uint8_t>(), d_scales.as<bf16_t>(), n);
  cuda::nf4_dequantize(d_xb.as<bf16_t>(), d_codes.as<uint8_t>(), d_scales.as<bf16_t>(), n);
  auto got = from_device<float>(d_x, want.size());
  CHECK_CLOSE(got.data(), want.data(), n, 0.0, 0.0);  // one f32 multiply on both sides: exact
  auto got_b = cuda_test::from_bf16(from_device<bf16_t>(d_xb, want.size()));
  auto want_b = cuda_test::rounded_to_bf16(want);
  CHECK_CLOSE(got_b.data(), want_b.data(), n, 0.0, 0.0);  // then round to nearest even
}

KTUNE_CUDA_TEST(Nf4LinearForwardAndInputGradientMatchDequantizedGemm) {
  const int64_t N = 24, in = 128, out = 96;
  auto codes = random_codes(static_cast<size_t>(out * in / 2), 3);
  auto scales = cuda_test::rounded_to_bf16(random_floats(static_cast<size_t>(out * in / 64), 4, 0.05f, 0.5f));
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
  auto d_codes = to_device(codes), d_scales = to_device(cuda_test::to_bf16(scales));
  auto d_x = to_device(cuda_test::to_bf16(x)), d_dy = to_device(cuda_test::to_bf16(dy)), d_dx = to_device(dx0);
  cuda::DeviceBuffer d_y(y.size() * 4), scratch(static_cast<size_t>(out * in) * 2);
  cuda::GemmContext ctx;
  cuda::nf4_linear_forward(ctx, d_y.as<float>(), d_x.as<bf16_t>(), d_codes.as<uint8_t>(), d_scales.as<bf16_t>(), N, in,
                           out, scratch.as<bf16_t>());
  cuda::nf4_linear_backward_input(ctx, d_dx.as<float>(), d_dy.as<bf16_t>(), d_codes.as<uint8_t>(),
                                  d_scales.as<bf16_t>(), N, in, out, scratch.as<bf16_t>(), true);
  auto got_y = from_device<float>(d_y, y.size()), got_dx = from_device<float>(d_dx, dx.size());
  // bf16 products are exact in f32; f32 accumulation over <= 128 terms of size <= 0.5: 1e-5.
  CHECK_CLOSE(got_y.data(), y.data(), int64_t(y.size()), 1e-5, 1e-5);
  CHECK_CLOSE(got_dx.data(), dx.data(), int64_t(dx.size()), 1e-5, 1e-5);
}


// C (M, N) = x (M, K) @ B where B(k, n) = w[n*K + k] (transposed) or w[k*N + n], in doubles.
std::vector<double> reference_product(const std::vector<float>& x, const std::vector<float>& w, int64_t M, int64_t N,
                                      int64_t K, bool w_transposed) {
  std::vector<double> c(size_t(M * N), 0.0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k)
        acc += double(x[size_t(m * K + k)]) * w[size_t(w_transposed ? n * K + k : k * N + n)];
      c[size_t(m * N + n)] = acc;
    }
  return c;
}

struct Nf4GemmInputs {
  std::vector<uint8_t> codes;
  std::vector<float> scales, w, x;  // w: W dequantised and rounded to bf16 (what the tensor cores multiply)
};

Nf4GemmInputs nf4_gemm_inputs(int64_t M, int64_t w_numel, int64_t K, uint32_t seed) {
  Nf4GemmInputs in;
  in.codes = random_codes(size_t(w_numel / 2), seed);
  in.scales = cuda_test::rounded_to_bf16(random_floats(size_t(w_numel / 64), seed + 1, 0.05f, 0.5f));
  in.w = cuda_test::rounded_to_bf16(dequantize(in.codes, in.scales));
  in.x = cuda_test::rounded_to_bf16(random_floats(size_t(M * K), seed + 2));
  return in;
}

// Both orientations, f32 C overwritten and accumulated (alpha, beta), M not a multiple of the tile.
KTUNE_CUDA_TEST(Nf4GemmFusedMatchesTheDequantizedProductInBothOrientations) {
  const int64_t M = 70, N = 128, K = 192;
  for (bool transposed : {true, false}) {
    auto in = nf4_gemm_inputs(M, N * K, K, transposed ? 11 : 21);
    const auto product = reference_product(in.x, in.w, M, N, K, transposed);
    const auto c0 = random_floats(size_t(M * N), 31);
    for (float beta : {0.0f, 1.0f}) {
      std::vector<float> want(size_t(M * N));
      for (size_t i = 0; i < want.size(); ++i) want[i] = float(0.5 * product[i] + beta * double(c0[i]));
      auto d_codes = to_device(in.codes), d_scales = to_device(cuda_test::to_bf16(in.scales));
      auto d_x = to_device(cuda_test::to_bf16(in.x));
      auto d_c = to_device(c0);
      cuda::Nf4GemmCall g;
      g.M = M, g.N = N, g.K = K, g.alpha = 0.5f, g.beta = beta;
      g.A = d_x.as<bf16_t>(), g.codes = d_codes.as<uint8_t>(), g.scales = d_scales.as<bf16_t>();
      g.w_transposed = transposed, g.C = d_c.as<float>(), g.out = DType::F32;
      cuda::nf4_gemm(g);
      auto got = from_device<float>(d_c, want.size());
      // bf16 products are exact in f32; f32 sums of 192 terms of size <= 0.5
      CHECK_CLOSE(got.data(), want.data(), M * N, 1e-5, 1e-5) << (transposed ? "W (N, K)" : "W (K, N)")
                                                             << " beta " << beta;
    }
  }
}

// A linear's forward as the decoder runs it: bf16 y accumulated (beta 1) plus a bf16 bias.
KTUNE_CUDA_TEST(Nf4GemmFusedWritesBf16WithBiasAndBeta) {
  const int64_t M = 33, N = 64, K = 128;
  auto in = nf4_gemm_inputs(M, N * K, K, 41);
  const auto product = reference_product(in.x, in.w, M, N, K, true);
  const auto y0 = cuda_test::rounded_to_bf16(random_floats(size_t(M * N), 42));
  const auto bias = cuda_test::rounded_to_bf16(random_floats(size_t(N), 43));
  std::vector<float> want(size_t(M * N));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n)
      want[size_t(m * N + n)] = float(product[size_t(m * N + n)] + y0[size_t(m * N + n)] + bias[size_t(n)]);
  auto d_codes = to_device(in.codes), d_scales = to_device(cuda_test::to_bf16(in.scales));
  auto d_x = to_device(cuda_test::to_bf16(in.x));
  auto d_y = to_device(cuda_test::to_bf16(y0)), d_bias = to_device(cuda_test::to_bf16(bias));
  cuda::Nf4GemmCall g;
  g.M = M, g.N = N, g.K = K, g.beta = 1.0f, g.A = d_x.as<bf16_t>(), g.codes = d_codes.as<uint8_t>();
  g.scales = d_scales.as<bf16_t>(), g.C = d_y.as<bf16_t>(), g.out = DType::BF16, g.bias = d_bias.as<bf16_t>();
  cuda::nf4_gemm(g);
  auto got = cuda_test::from_bf16(from_device<bf16_t>(d_y, want.size()));
  CHECK_CLOSE(got.data(), want.data(), M * N, 1e-5, 1.0 / 256);  // within half a bf16 step (+ f32 sums)
}

// The fused GEMM and the plain path (nf4_dequantize into scratch, then the GEMM) multiply the same
// bf16 values: equal up to the order of the f32 sums.
KTUNE_CUDA_TEST(Nf4GemmFusedEqualsThePlainPath) {
  const int64_t N = 24, in = 256, out = 128;
  auto inputs = nf4_gemm_inputs(N, out * in, in, 51);
  auto dy = cuda_test::to_bf16(random_floats(size_t(N * out), 52));
  auto d_codes = to_device(inputs.codes), d_scales = to_device(cuda_test::to_bf16(inputs.scales));
  auto d_x = to_device(cuda_test::to_bf16(inputs.x)), d_dy = to_device(dy);
  cuda::DeviceBuffer y_plain(size_t(N * out) * 4), y_fused(size_t(N * out) * 4), dx_plain(size_t(N * in) * 4),
      dx_fused(size_t(N * in) * 4), scratch(size_t(out * in) * 2);
  cuda::GemmContext ctx;
  cuda::nf4_linear_forward(ctx, y_plain.as<float>(), d_x.as<bf16_t>(), d_codes.as<uint8_t>(), d_scales.as<bf16_t>(), N,
                           in, out, scratch.as<bf16_t>());
  cuda::nf4_linear_backward_input(ctx, dx_plain.as<float>(), d_dy.as<bf16_t>(), d_codes.as<uint8_t>(),
                                  d_scales.as<bf16_t>(), N, in, out, scratch.as<bf16_t>(), false);
  cuda::Nf4GemmCall g;
  g.M = N, g.N = out, g.K = in, g.A = d_x.as<bf16_t>(), g.codes = d_codes.as<uint8_t>();
  g.scales = d_scales.as<bf16_t>(), g.w_transposed = true, g.C = y_fused.as<float>();
  cuda::nf4_gemm(g);
  g.N = in, g.K = out, g.A = d_dy.as<bf16_t>(), g.w_transposed = false, g.C = dx_fused.as<float>();
  cuda::nf4_gemm(g);
  auto yp = from_device<float>(y_plain, size_t(N * out)), yf = from_device<float>(y_fused, size_t(N * out));
  auto dxp = from_device<float>(dx_plain, size_t(N * in)), dxf = from_device<float>(dx_fused, size_t(N * in));
  CHECK_CLOSE(yf.data(), yp.data(), N * out, 1e-5, 1e-5);
  CHECK_CLOSE(dxf.data(), dxp.data(), N * in, 1e-5, 1e-5);
}

KTUNE_CUDA_TEST(Nf4GemmRefusesShapesItDoesNotTake) {
  CHECK(cuda::nf4_gemm_supports(4096, 14336));
  CHECK(!cuda::nf4_gemm_supports(96, 128)) << "N not a multiple of 64";
  CHECK(!cuda::nf4_gemm_supports(128, 32)) << "K not a multiple of 64";
  cuda::DeviceBuffer a(64 * 64 * 2 + 16), codes(96 * 64 / 2), scales(96 * 64 / 64 * 2), c(64 * 96 * 4);
  cuda::Nf4GemmCall g;
  g.M = 64, g.N = 96, g.K = 64, g.A = a.as<bf16_t>(), g.codes = codes.as<uint8_t>(), g.scales = scales.as<bf16_t>();
  g.C = c.as<float>();
  auto refused = [](const cuda::Nf4GemmCall& call, const std::string& says) {
    try {
      cuda::nf4_gemm(call);
    } catch (const Error& e) {
      return std::string(e.what()).find(says) != std::string::npos;
    }
    return false;
  };
  CHECK(refused(g, "multiples of 64")) << "N = 96";
  g.N = 64;
  g.A = reinterpret_cast<const bf16_t*>(reinterpret_cast<const char*>(a.as<bf16_t>()) + 2);
  CHECK(refused(g, "16-byte aligned")) << "A one element off";
}

}  // namespace
}  // namespace ktune
