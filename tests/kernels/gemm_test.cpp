// gemm (oneDNN) against the triple-loop reference: every transpose form, odd sizes, alpha/beta,
// strided sub-matrices, bf16 inputs; linear layers against their reference and finite differences.
#include "kernels/cpu/gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "gradient_check.h"
#include "kernels/cpu/linear.h"

using namespace ktune::cpu;
using namespace ktune::cpu::testing;

namespace {

struct GemmCase {
  int64_t M, N, K;
  float alpha, beta;
};

void check_gemm_case(bool ta, bool tb, const GemmCase& c) {
  auto A = random_vector(size_t(c.M * c.K), 1), B = random_vector(size_t(c.K * c.N), 2);
  auto C0 = random_vector(size_t(c.M * c.N), 3);
  std::vector<float> fast = C0, ref = C0;
  gemm(ta, tb, c.M, c.N, c.K, c.alpha, A.data(), B.data(), c.beta, fast.data());
  gemm_reference(ta, tb, c.M, c.N, c.K, c.alpha, A.data(), B.data(), c.beta, ref.data());
  expect_close(fast, ref, 1e-5 * std::sqrt(double(c.K)) + 1e-6,
               "gemm ta=" + std::to_string(ta) + " tb=" + std::to_string(tb) + " M=" + std::to_string(c.M) +
                   " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K));
}

}  // namespace

TEST(Gemm, MatchesReferenceInAllTransposeFormsAtOddSizes) {
  const std::vector<GemmCase> cases = {{37, 29, 53, 1.0f, 0.0f},   {130, 70, 261, 0.5f, 1.0f},
                                       {1, 300, 17, 2.0f, -0.5f},  {65, 1, 129, 1.0f, 1.0f},
                                       {3, 5, 7, 1.0f, 0.25f},     {200, 33, 1, -1.0f, 0.0f}};
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (const auto& c : cases) check_gemm_case(ta, tb, c);
}

TEST(Gemm, BetaZeroIgnoresNaNInC) {
  const int64_t M = 40, N = 50, K = 60;
  auto A = random_vector(size_t(M * K), 4), B = random_vector(size_t(K * N), 5);
  std::vector<float> C(size_t(M * N), NAN), ref(size_t(M * N), 0.0f);
  gemm(false, false, M, N, K, 1.0f, A.data(), B.data(), 0.0f, C.data());
  gemm_reference(false, false, M, N, K, 1.0f, A.data(), B.data(), 0.0f, ref.data());
  expect_close(C, ref, 1e-5, "beta=0 over NaN");
}

TEST(Gemm, ZeroInnerDimensionScalesC) {
  std::vector<float> C = {1, 2, 3, 4, 5, 6};
  gemm(false, false, 2, 3, 0, 1.0f, nullptr, nullptr, 0.5f, C.data());
  EXPECT_EQ(C, (std::vector<float>{0.5f, 1, 1.5f, 2, 2.5f, 3}));
}

TEST(Gemm, StridedSubmatricesMatchReference) {
  // A, B, C are windows into wider row-major buffers.
  const int64_t M = 33, N = 45, K = 70, lda = 100, ldb = 80, ldc = 64;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      auto Abuf = random_vector(size_t(std::max(M, K) * lda), 6), Bbuf = random_vector(size_t(std::max(K, N) * ldb), 7);
      auto Cbuf = random_vector(size_t(M * ldc), 8);
      std::vector<float> fast = Cbuf;
      gemm_strided(ta, tb, M, N, K, 0.75f, Abuf.data() + 3, lda, Bbuf.data() + 5, ldb, 1.0f, fast.data() + 2, ldc);
      // Dense copies through the plain reference.
      std::vector<float> A(size_t(M * K)), B(size_t(K * N)), C(size_t(M * N));
      const int64_t arows = ta ? K : M, acols = ta ? M : K, brows = tb ? N : K, bcols = tb ? K : N;
      for (int64_t r = 0; r < arows; ++r)
        for (int64_t c = 0; c < acols; ++c) A[size_t(r * acols + c)] = Abuf[size_t(r * lda + 3 + c)];
      for (int64_t r = 0; r < brows; ++r)
        for (int64_t c = 0; c < bcols; ++c) B[size_t(r * bcols + c)] = Bbuf[size_t(r * ldb + 5 + c)];
      for (int64_t r = 0; r < M; ++r)
        for (int64_t c = 0; c < N; ++c) C[size_t(r * N + c)] = Cbuf[size_t(r * ldc + 2 + c)];
      gemm_reference(ta, tb, M, N, K, 0.75f, A.data(), B.data(), 1.0f, C.data());
      std::vector<float> window(size_t(M * N));
      for (int64_t r = 0; r < M; ++r)
        for (int64_t c = 0; c < N; ++c) window[size_t(r * N + c)] = fast[size_t(r * ldc + 2 + c)];
      expect_close(window, C, 1e-5, "strided gemm");
      // Outside the window nothing changed.
      for (int64_t r = 0; r < M; ++r) {
        EXPECT_EQ(fast[size_t(r * ldc)], Cbuf[size_t(r * ldc)]);
        EXPECT_EQ(fast[size_t(r * ldc + 1)], Cbuf[size_t(r * ldc + 1)]);
        if (2 + N < ldc) {
          EXPECT_EQ(fast[size_t(r * ldc + 2 + N)], Cbuf[size_t(r * ldc + 2 + N)]);
        }
      }
    }
}

TEST(Gemm, Bf16InputsMatchReferenceOnTheRoundedValues) {
  const int64_t M = 48, N = 80, K = 96;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      auto Af = random_vector(size_t(M * K), 9), Bf = random_vector(size_t(K * N), 10);
      std::vector<ktune::bf16_t> A(Af.size()), B(Bf.size());
      for (size_t i = 0; i < A.size(); ++i) A[i] = ktune::f32_to_bf16(Af[i]);
      for (size_t i = 0; i < B.size(); ++i) B[i] = ktune::f32_to_bf16(Bf[i]);
      std::vector<float> fast(size_t(M * N), 1.0f), ref(size_t(M * N), 1.0f);
      gemm_bf16(ta, tb, M, N, K, 1.5f, A.data(), B.data(), 0.5f, fast.data());
      gemm_bf16_reference(ta, tb, M, N, K, 1.5f, A.data(), B.data(), 0.5f, ref.data());
      // Products of bf16 values are exact in f32; only the f32 accumulation order differs.
      expect_close(fast, ref, 1e-5, "bf16 gemm");
    }
}

TEST(Gemm, RepeatedShapesReuseCachedPrimitives) {
  const int64_t M = 64, N = 96, K = 128;
  auto A = random_vector(size_t(M * K), 11), B = random_vector(size_t(K * N), 12);
  std::vector<float> C(size_t(M * N));
  gemm(false, true, M, N / 2, K, 1.0f, A.data(), B.data(), 0.0f, C.data());
  const int64_t after_first = gemm_cached_primitives();
  for (int i = 0; i < 5; ++i) gemm(false, true, M, N / 2, K, 1.0f, A.data(), B.data(), 0.0f, C.data());
  EXPECT_EQ(gemm_cached_primitives(), after_first);
  gemm(false, false, M, N, K, 1.0f, A.data(), B.data(), 0.0f, C.data());
  EXPECT_EQ(gemm_cached_primitives(), after_first + 1);
}

TEST(Gemm, RejectsLeadingDimensionsSmallerThanTheRow) {
  std::vector<float> A(100), B(100), C(100);
  EXPECT_THROW(gemm_strided(false, false, 4, 4, 8, 1.0f, A.data(), 4, B.data(), 4, 0.0f, C.data(), 4), ktune::Error);
}

TEST(Gemm, MeasuredRateIsPositive) {
  EXPECT_GT(measure_gemm_gflops(64, 64, 64, 0.01), 0.0);
  EXPECT_GT(measure_gemm_bf16_gflops(64, 64, 64, 0.01), 0.0);
}

TEST(Linear, ForwardMatchesReferenceWithAndWithoutBias) {
  const int64_t N = 23, in = 40, out = 31;
  auto x = random_vector(size_t(N * in), 13), w = random_vector(size_t(out * in), 14), b = random_vector(size_t(out), 15);
  for (const float* bias : {static_cast<const float*>(nullptr), static_cast<const float*>(b.data())}) {
    std::vector<float> y(size_t(N * out)), ref(size_t(N * out));
    linear_forward(y.data(), x.data(), w.data(), bias, N, in, out);
    linear_forward_reference(ref.data(), x.data(), w.data(), bias, N, in, out);
    expect_close(y, ref, 1e-5, bias ? "with bias" : "without bias");
  }
}

TEST(Linear, BackwardMatchesReferenceAndAccumulates) {
  const int64_t N = 19, in = 37, out = 29;
  auto x = random_vector(size_t(N * in), 16), w = random_vector(size_t(out * in), 17);
  auto dy = random_vector(size_t(N * out), 18);
  for (bool accumulate : {false, true}) {
    auto dx = random_vector(size_t(N * in), 19), dw = random_vector(size_t(out * in), 20), db = random_vector(size_t(out), 21);
    auto dx_ref = dx, dw_ref = dw, db_ref = db;
    linear_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), N, in, out, accumulate);
    linear_backward_reference(dx_ref.data(), dw_ref.data(), db_ref.data(), dy.data(), x.data(), w.data(), N, in, out,
                              accumulate);
    expect_close(dx, dx_ref, 1e-5, "dx");
    expect_close(dw, dw_ref, 1e-5, "dw");
    expect_close(db, db_ref, 1e-5, "db");
  }
  // Only dx: the others may be null.
  std::vector<float> dx(size_t(N * in));
  linear_backward(dx.data(), nullptr, nullptr, dy.data(), x.data(), w.data(), N, in, out, false);
}

TEST(Linear, BackwardMatchesFiniteDifferences) {
  const int64_t N = 6, in = 9, out = 7;
  auto x = random_vector(size_t(N * in), 22), w = random_vector(size_t(out * in), 23), b = random_vector(size_t(out), 24);
  auto r = random_vector(size_t(N * out), 25);
  auto loss = [&] {
    std::vector<float> y(size_t(N * out));
    linear_forward(y.data(), x.data(), w.data(), b.data(), N, in, out);
    return dot(y, r);
  };
  std::vector<float> dx(size_t(N * in)), dw(size_t(out * in), 0.0f), db(size_t(out), 0.0f);
  linear_backward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), N, in, out, false);
  expect_gradient_matches_finite_differences(loss, x, dx, "dx");
  expect_gradient_matches_finite_differences(loss, w, dw, "dw");
  expect_gradient_matches_finite_differences(loss, b, db, "db");
}
