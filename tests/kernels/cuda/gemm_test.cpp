// cuBLASLt GEMMs against a double-precision triple loop on the same (bf16-rounded) inputs, for
// every transpose form, packed and strided, f32 and bf16 results, with beta and the fused bias.
// Tolerances: bf16 inputs are exact in the f32 products, so the f32 result differs from the double
// loop only by f32 accumulation error (~K * 2^-24 * sum|a b|, < 1e-5 here for |a|,|b| <= 1, K <= 300):
// atol = rtol = 1e-4. A bf16 result adds one rounding (relative 2^-9): rtol 8e-3.
#include "cuda_test_harness.h"
#include "kernels/cuda/gemm.h"

namespace ktune {
namespace {

using cuda_test::from_device;
using cuda_test::random_floats;
using cuda_test::to_device;

// C (M,N) with row stride ldc = alpha op(A) op(B) + beta C, in double.
void gemm_loops(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k)
        acc += double(ta ? A[k * lda + i] : A[i * lda + k]) * double(tb ? B[j * ldb + k] : B[k * ldb + j]);
      C[i * ldc + j] = float(alpha * acc + (beta == 0.0f ? 0.0 : double(beta) * C[i * ldc + j]));
    }
}

void check_bf16_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, float beta, int64_t pad) {
  // Stored shapes, with `pad` extra columns of row stride when pad > 0 (strided sub-matrices).
  const int64_t a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
  const int64_t lda = a_cols + pad, ldb = b_cols + pad, ldc = N + pad;
  auto a = cuda_test::rounded_to_bf16(random_floats(static_cast<size_t>(a_rows * lda), 1));
  auto b = cuda_test::rounded_to_bf16(random_floats(static_cast<size_t>(b_rows * ldb), 2));
  auto c0 = random_floats(static_cast<size_t>(M * ldc), 3);
  auto want = c0;
  gemm_loops(ta, tb, M, N, K, alpha, a.data(), lda, b.data(), ldb, beta, want.data(), ldc);
  auto da = to_device(cuda_test::to_bf16(a)), db = to_device(cuda_test::to_bf16(b)), dc = to_device(c0);
  cuda::GemmContext ctx;
  cuda::gemm_bf16_strided(ctx, ta, tb, M, N, K, alpha, da.as<bf16_t>(), pad ? lda : 0, db.as<bf16_t>(),
                          pad ? ldb : 0, beta, dc.as<float>(), pad ? ldc : 0);
  auto got = from_device<float>(dc, c0.size());
  CHECK_CLOSE(got.data(), want.data(), int64_t(got.size()), 1e-4, 1e-4)
      << "trans_a=" << ta << " trans_b=" << tb << " M=" << M << " N=" << N << " K=" << K << " pad=" << pad;
}

KTUNE_CUDA_TEST(GemmBf16MatchesReferenceForEveryTransposeForm) {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      check_bf16_gemm(ta, tb, 64, 96, 128, 1.0f, 0.0f, 0);
      check_bf16_gemm(ta, tb, 37, 53, 29, 0.5f, 0.0f, 0);  // odd sizes: unaligned leading dimensions
    }
}

KTUNE_CUDA_TEST(GemmBf16AccumulatesWithBetaIntoStridedSubMatrices) {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) check_bf16_gemm(ta, tb, 48, 40, 72, 1.5f, 1.0f, 8);
  check_bf16_gemm(false, true, 33, 65, 300, 1.0f, -0.5f, 3);
}

KTUNE_CUDA_TEST(GemmF32IsStrictF32NotTf32) {
  // TF32 keeps 10 mantissa bits: inputs with low bits set would be off by ~1e-3 relative; strict f32 is ~1e-6.
  const int64_t M = 40, N = 24, K = 256;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      auto a = random_floats(static_cast<size_t>(M * K), 4), b = random_floats(static_cast<size_t>(K * N), 5);
      std::vector<float> want(static_cast<size_t>(M * N), 0.0f);
      gemm_loops(ta, tb, M, N, K, 1.0f, a.data(), ta ? M : K, b.data(), tb ? K : N, 0.0f, want.data(), N);
      auto da = to_device(a), db = to_device(b);
      cuda::DeviceBuffer dc(want.size() * sizeof(float));
      cuda::GemmContext ctx;
      cuda::gemm(ctx, ta, tb, M, N, K, 1.0f, da.as<float>(), db.as<float>(), 0.0f, dc.as<float>());
      auto got = from_device<float>(dc, want.size());
      // f32 accumulation over K = 256 of |a b| <= 1: ~5e-6 RMS; TF32 inputs would be off by ~2e-3.
      CHECK_CLOSE(got.data(), want.data(), int64_t(got.size()), 1e-4, 1e-5) << "trans_a=" << ta << " trans_b=" << tb;
    }
}

KTUNE_CUDA_TEST(GemmBf16OutputIsTheRoundedF32Result) {
  const int64_t M = 64, N = 80, K = 96;
  auto a = cuda_test::rounded_to_bf16(random_floats(static_cast<size_t>(M * K), 6));
  auto b = cuda_test::rounded_to_bf16(random_floats(static_cast<size_t>(N * K), 7));
  std::vector<float> want(static_cast<size_t>(M * N), 0.0f);
  gemm_loops(false, true, M, N, K, 1.0f, a.data(), K, b.data(), K, 0.0f, want.data(), N);
  auto da = to_device(cuda_test::to_bf16(a)), db = to_device(cuda_test::to_bf16(b));
  cuda::DeviceBuffer dc(static_cast<size_t>(M * N) * sizeof(bf16_t));
  cuda::GemmContext ctx;
  cuda::gemm_bf16_out_bf16(ctx, false, true, M, N, K, 1.0f, da.as<bf16_t>(), db.as<bf16_t>(), 0.0f, dc.as<bf16_t>());
  auto got = cuda_test::from_bf16(from_device<bf16_t>(dc, want.size()));
  CHECK_CLOSE(got.data(), want.data(), int64_t(got.size()), 1e-4, 8e-3);
}

KTUNE_CUDA_TEST(GemmFusedBiasIsAddedToEveryRow) {
  // linear: y (N_tok, out) = x (N_tok, in) @ W^T + b
  const int64_t rows = 50, in = 64, out = 72;
  auto x = cuda_test::rounded_to_bf16(random_floats(static_cast<size_t>(rows * in), 8));
  auto w = cuda_test::rounded_to_bf16(random_floats(static_cast<size_t>(out * in), 9));
  auto bias = random_floats(static_cast<size_t>(out), 10);
  std::vector<float> want(static_cast<size_t>(rows * out), 0.0f);
  gemm_loops(false, true, rows, out, in, 1.0f, x.data(), in, w.data(), in, 0.0f, want.data(), out);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < out; ++c) want[size_t(r * out + c)] += bias[size_t(c)];
  auto dx = to_device(cuda_test::to_bf16(x)), dw = to_device(cuda_test::to_bf16(w)), db = to_device(bias);
  cuda::DeviceBuffer dy(want.size() * sizeof(float));
  cuda::GemmContext ctx;
  cuda::GemmCall g;
  g.trans_b = true, g.M = rows, g.N = out, g.K = in, g.A = dx.data(), g.B = dw.data(), g.C = dy.data();
  g.bias = db.data();
  ctx.run(g);
  auto got = from_device<float>(dy, want.size());
  CHECK_CLOSE(got.data(), want.data(), int64_t(got.size()), 1e-4, 1e-4);
}

// Strided batches (GemmCall::batch), as the tensor-core attention uses them: sub-matrices with row
// strides wider than their rows, batch strides with gaps, f32 and bf16 results, beta = 1.
void check_batched_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float beta, DType out) {
  const int64_t batch = 3, pad = 8;
  const int64_t a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
  const int64_t lda = a_cols + pad, ldb = b_cols + pad, ldc = N + pad;
  const int64_t sa = a_rows * lda + 16, sb = b_rows * ldb + 24, sc = M * ldc + 32;  // gaps between products
  auto a = cuda_test::rounded_to_bf16(random_floats(static_cast<size_t>(batch * sa), 21));
  auto b = cuda_test::rounded_to_bf16(random_floats(static_cast<size_t>(batch * sb), 22));
  auto c0 = random_floats(static_cast<size_t>(batch * sc), 23);
  if (out == DType::BF16) c0 = cuda_test::rounded_to_bf16(c0);
  auto want = c0;
  for (int64_t i = 0; i < batch; ++i)
    gemm_loops(ta, tb, M, N, K, 0.75f, a.data() + i * sa, lda, b.data() + i * sb, ldb, beta, want.data() + i * sc, ldc);
  auto da = to_device(cuda_test::to_bf16(a)), db = to_device(cuda_test::to_bf16(b));
  cuda::DeviceBuffer dc = out == DType::F32 ? to_device(c0) : to_device(cuda_test::to_bf16(c0));
  cuda::GemmCall g;
  g.trans_a = ta, g.trans_b = tb, g.M = M, g.N = N, g.K = K, g.alpha = 0.75f, g.beta = beta;
  g.A = da.data(), g.lda = lda, g.B = db.data(), g.ldb = ldb, g.C = dc.data(), g.ldc = ldc;
  g.in = DType::BF16, g.out = out, g.batch = batch, g.stride_a = sa, g.stride_b = sb, g.stride_c = sc;
  cuda::GemmContext ctx;
  ctx.run(g);
  std::vector<float> got = out == DType::F32 ? from_device<float>(dc, c0.size())
                                             : cuda_test::from_bf16(from_device<bf16_t>(dc, c0.size()));
  // Only the products' rows are compared; the gaps and pads must be left as they were.
  const double rtol = out == DType::F32 ? 1e-4 : 8e-3;
  CHECK_CLOSE(got.data(), want.data(), int64_t(got.size()), 1e-4, rtol)
      << "batched trans_a=" << ta << " trans_b=" << tb << " M=" << M << " N=" << N << " K=" << K << " beta=" << beta
      << (out == DType::F32 ? " f32" : " bf16");
}

KTUNE_CUDA_TEST(GemmStridedBatchesMatchOneProductEach) {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      check_batched_gemm(ta, tb, 40, 24, 64, 0.0f, DType::F32);
      check_batched_gemm(ta, tb, 40, 24, 64, 1.0f, DType::F32);
      check_batched_gemm(ta, tb, 32, 48, 40, 0.0f, DType::BF16);
    }
}

KTUNE_CUDA_TEST(GemmCachesOnePlanPerShape) {
  const int64_t M = 32, N = 32, K = 32;
  cuda::DeviceBuffer a(static_cast<size_t>(M * K) * 2), b(static_cast<size_t>(K * N) * 2), c(static_cast<size_t>(M * N) * 4);
  a.zero();
  b.zero();
  cuda::GemmContext ctx;
  for (int i = 0; i < 3; ++i)
    cuda::gemm_bf16(ctx, false, false, M, N, K, 1.0f, a.as<bf16_t>(), b.as<bf16_t>(), 0.0f, c.as<float>());
  CHECK(ctx.cached_plans() == 1) << ctx.cached_plans();
  cuda::gemm_bf16(ctx, true, false, M, N, K, 1.0f, a.as<bf16_t>(), b.as<bf16_t>(), 0.0f, c.as<float>());
  CHECK(ctx.cached_plans() == 2) << ctx.cached_plans();
  std::vector<float> zeros(static_cast<size_t>(M * N), 0.0f);
  auto got = from_device<float>(c, zeros.size());
  CHECK_CLOSE(got.data(), zeros.data(), int64_t(zeros.size()), 0.0, 0.0);
}

KTUNE_CUDA_TEST(GemmWithEmptyInnerDimensionScalesC) {
  std::vector<float> c0 = random_floats(12, 11), want(12);
  for (size_t i = 0; i < 12; ++i) want[i] = 2.0f * c0[i];
  auto dc = to_device(c0);
  cuda::GemmContext ctx;
  cuda::gemm_bf16(ctx, false, false, 3, 4, 0, 1.0f, nullptr, nullptr, 2.0f, dc.as<float>());
  auto got = from_device<float>(dc, 12);
  CHECK_CLOSE(got.data(), want.data(), 12, 0.0, 1e-7);
}

}  // namespace
}  // namespace ktune
