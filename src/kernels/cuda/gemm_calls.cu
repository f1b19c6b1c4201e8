// The CPU gemm's signatures on the GPU (kernels/cuda/gemm.h), each one GemmCall for a GemmContext,
// and the GEMM ceiling the benchmarks print: the wrappers over gemm.cu's GemmContext (the context
// itself, over cuBLASLt, is gemm.cu's).
#include <cuda_runtime.h>

#include <algorithm>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/gemm.h"

namespace ktune::cuda {

GemmLeadingDims checked_leading_dims(const GemmCall& g) {
  check(g.M >= 0 && g.N >= 0 && g.K >= 0, "cuda gemm", "negative size");
  check(g.in == DType::BF16 || g.in == DType::F32, "cuda gemm", "inputs must be bf16 or f32");
  check(g.out == DType::BF16 || g.out == DType::F32, "cuda gemm", "output must be bf16 or f32");
  check(!(g.in == DType::F32 && g.out == DType::BF16), "cuda gemm", "f32 inputs need an f32 output");
  GemmLeadingDims ld;
  ld.lda = g.lda ? g.lda : (g.trans_a ? g.M : g.K);
  ld.ldb = g.ldb ? g.ldb : (g.trans_b ? g.K : g.N);
  ld.ldc = g.ldc ? g.ldc : g.N;
  check(ld.lda >= (g.trans_a ? g.M : g.K) && ld.ldb >= (g.trans_b ? g.K : g.N) && ld.ldc >= g.N, "cuda gemm",
        "a leading dimension is smaller than the row it strides over");
  check(g.batch >= 1, "cuda gemm", "batch must be at least 1");
  check(g.batch == 1 || g.bias == nullptr, "cuda gemm", "no bias with a batched product");
  check(g.K > 0 || g.bias == nullptr, "cuda gemm", "bias with K == 0 is not supported");
  check(g.K > 0 || g.batch == 1, "cuda gemm", "batched product with K == 0 is not supported");
  return ld;
}

void gemm(GemmContext& ctx, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          const float* B, float beta, float* C, Stream stream) {
  GemmCall g;
  g.trans_a = trans_a, g.trans_b = trans_b, g.M = M, g.N = N, g.K = K, g.alpha = alpha, g.beta = beta;
  g.A = A, g.B = B, g.C = C, g.in = DType::F32, g.out = DType::F32;
  ctx.run(g, stream);
}

void gemm_bf16(GemmContext& ctx, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const bf16_t* A, const bf16_t* B, float beta, float* C, Stream stream) {
  gemm_bf16_strided(ctx, trans_a, trans_b, M, N, K, alpha, A, 0, B, 0, beta, C, 0, stream);
}

void gemm_bf16_strided(GemmContext& ctx, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                       const bf16_t* A, int64_t lda, const bf16_t* B, int64_t ldb, float beta, float* C, int64_t ldc,
                       Stream stream) {
  GemmCall g;
  g.trans_a = trans_a, g.trans_b = trans_b, g.M = M, g.N = N, g.K = K, g.alpha = alpha, g.beta = beta;
  g.A = A, g.lda = lda, g.B = B, g.ldb = ldb, g.C = C, g.ldc = ldc, g.in = DType::BF16, g.out = DType::F32;
  ctx.run(g, stream);
}

void gemm_bf16_out_bf16(GemmContext& ctx, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                        const bf16_t* A, const bf16_t* B, float beta, bf16_t* C, Stream stream) {
  GemmCall g;
  g.trans_a = trans_a, g.trans_b = trans_b, g.M = M, g.N = N, g.K = K, g.alpha = alpha, g.beta = beta;
  g.A = A, g.B = B, g.C = C, g.in = DType::BF16, g.out = DType::BF16;
  ctx.run(g, stream);
}

double measure_gemm_bf16_tflops(GemmContext& ctx, int64_t M, int64_t N, int64_t K, double seconds) {
  DeviceBuffer a(size_t(M * K) * 2), b(size_t(K * N) * 2), c(size_t(M * N) * 2);
  // Values do not change the rate; fill with small bf16 numbers (0x3c00 = 0.0078125) to avoid inf.
  KTUNE_CUDA_CHECK(cudaMemset(a.data(), 0x3c, a.bytes()));
  KTUNE_CUDA_CHECK(cudaMemset(b.data(), 0x3c, b.bytes()));
  auto run = [&] {
    gemm_bf16_out_bf16(ctx, false, false, M, N, K, 1.0f, a.as<bf16_t>(), b.as<bf16_t>(), 0.0f, c.as<bf16_t>());
  };
  for (int i = 0; i < 3; ++i) run();  // plan, clocks up
  KTUNE_CUDA_CHECK(cudaDeviceSynchronize());
  cudaEvent_t start, stop;
  KTUNE_CUDA_CHECK(cudaEventCreate(&start));
  KTUNE_CUDA_CHECK(cudaEventCreate(&stop));
  // Calibrate the count from one timed batch of 10, then run about `seconds` worth.
  KTUNE_CUDA_CHECK(cudaEventRecord(start));
  for (int i = 0; i < 10; ++i) run();
  KTUNE_CUDA_CHECK(cudaEventRecord(stop));
  KTUNE_CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  KTUNE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  int64_t iterations = std::max<int64_t>(10, int64_t(seconds * 1000.0 / std::max(1e-3f, ms / 10.0f)));
  KTUNE_CUDA_CHECK(cudaEventRecord(start));
  for (int64_t i = 0; i < iterations; ++i) run();
  KTUNE_CUDA_CHECK(cudaEventRecord(stop));
  KTUNE_CUDA_CHECK(cudaEventSynchronize(stop));
  KTUNE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return 2.0 * double(M) * double(N) * double(K) * double(iterations) / (double(ms) * 1e-3) / 1e12;
}

}  // namespace ktune::cuda
