// GEMM on NVIDIA GPUs through cuBLASLt, with the CPU gemm's conventions (kernels/cpu/gemm.h):
// row-major everywhere, C(M,N) = alpha * op(A)(M,K) @ op(B)(K,N) + beta * C, A stored (M,K) or
// (K,M) when trans_a, B stored (K,N) or (N,K) when trans_b, leading dimensions as row strides.
// Inputs bf16 (tensor cores) or f32 (strict f32 compute, no TF32); the result f32 or bf16; the
// accumulation is always f32. An optional bias (N) is fused as cuBLASLt's epilogue (linear's b).
// A GemmContext owns the cuBLASLt handle, a 32 MiB workspace and the plans (descriptors plus the
// heuristic's algorithm) cached per shape, so a training step runs no heuristic after the first; the
// handle and the workspace are made by its first product (a context that multiplies nothing touches
// no device).
// Strided-batched products (GemmCall::batch) share one plan. It deliberately does not do FP8, or any
// epilogue beyond the bias; a context is not thread-safe (one per thread or stream).
#pragma once

#include <cstdint>
#include <memory>

#include "core/dtype.h"

struct CUstream_st;

namespace ktune::cuda {

using Stream = CUstream_st*;  // a cudaStream_t; nullptr is the default stream

struct GemmCall {
  bool trans_a = false, trans_b = false;
  int64_t M = 0, N = 0, K = 0;
  float alpha = 1.0f, beta = 0.0f;  // beta == 0 never reads C
  const void* A = nullptr;
  int64_t lda = 0;  // 0: packed (K, or M when trans_a)
  const void* B = nullptr;
  int64_t ldb = 0;  // 0: packed (N, or K when trans_b)
  void* C = nullptr;
  int64_t ldc = 0;  // 0: packed (N)
  DType in = DType::BF16;   // A and B: BF16 or F32
  DType out = DType::F32;   // C: F32 or BF16 (F32 inputs need an F32 C)
  const void* bias = nullptr;  // (N) in the dtype of C, added to every row; nullptr: none
  // Strided batch: `batch` products, the i-th on A + i*stride_a, B + i*stride_b, C + i*stride_c
  // (strides in elements; batch 1 ignores them). No bias with batch > 1.
  int64_t batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
};

// A call's leading dimensions resolved (0: packed) after checking it: sizes, dtypes, leading
// dimensions, batch and bias rules. Throws ktune::Error ("cuda gemm", what is wrong).
struct GemmLeadingDims {
  int64_t lda = 0, ldb = 0, ldc = 0;
};
GemmLeadingDims checked_leading_dims(const GemmCall& call);

class GemmContext {
 public:
  GemmContext();
  ~GemmContext();
  GemmContext(const GemmContext&) = delete;
  GemmContext& operator=(const GemmContext&) = delete;

  void run(const GemmCall& call, Stream stream = nullptr);
  int64_t cached_plans() const;
  // The products launched so far (a strided batch counts once; empty ones none): each costs the
  // host a cuBLASLt call, so a step of many small ones may wait on the host, not the GPU.
  int64_t calls() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// The CPU gemm's signatures, on device pointers (asynchronous on `stream`).
void gemm(GemmContext& ctx, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          const float* B, float beta, float* C, Stream stream = nullptr);
void gemm_bf16(GemmContext& ctx, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const bf16_t* A, const bf16_t* B, float beta, float* C, Stream stream = nullptr);
void gemm_bf16_strided(GemmContext& ctx, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                       const bf16_t* A, int64_t lda, const bf16_t* B, int64_t ldb, float beta, float* C, int64_t ldc,
                       Stream stream = nullptr);
// bf16 result (rounded to nearest even from the f32 accumulator).
void gemm_bf16_out_bf16(GemmContext& ctx, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                        const bf16_t* A, const bf16_t* B, float beta, bf16_t* C, Stream stream = nullptr);

// The ceiling benchmarks print: TFLOP/s (2*M*N*K per product) of bf16 (M,K)@(K,N) -> bf16 C
// (f32 accumulation), timed with CUDA events over about `seconds` after a warm-up.
double measure_gemm_bf16_tflops(GemmContext& ctx, int64_t M, int64_t N, int64_t K, double seconds);

}  // namespace ktune::cuda
