// GEMM on the CPU: every matrix product of the engine goes through here, to oneDNN's matmul
// primitive (f32, or bf16 inputs with an f32 result; f32 accumulation). Primitives are created
// once per shape/transpose/stride/alpha/beta and cached, so a training step creates none after
// the first. Row-major everywhere; transposes are expressed as strides, never as copies.
// It deliberately does not do batched or broadcast products (callers loop), nor int8.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace ktune::cpu {

// C(M,N) = alpha * op(A)(M,K) @ op(B)(K,N) + beta * C.
// A stored (M,K), or (K,M) when trans_a; B stored (K,N), or (N,K) when trans_b; C (M,N).
// beta == 0 never reads C (it may hold NaN).
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          const float* B, float beta, float* C);
// bf16 inputs, f32 output (f32 accumulation). See gemm_bf16_native() for CPUs without bf16 kernels.
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const bf16_t* A,
               const bf16_t* B, float beta, float* C);

// The same with explicit leading dimensions (row strides in elements) for sub-matrices:
// lda is the row stride of A as stored ((M,K) or (K,M) when trans_a), likewise ldb, ldc.
void gemm_strided(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                  int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
void gemm_bf16_strided(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                       const bf16_t* A, int64_t lda, const bf16_t* B, int64_t ldb, float beta, float* C,
                       int64_t ldc);

// Plain triple loops (double accumulation) that the tests compare the fast ones against.
void gemm_reference(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                    const float* B, float beta, float* C);
void gemm_bf16_reference(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                         const bf16_t* A, const bf16_t* B, float beta, float* C);

// The ceiling benchmarks print: GFLOP/s (2*M*N*K per product) of gemm() on (M,K)@(K,N), f32,
// timed for about `seconds` after a warm-up, with the threads in force (core/parallel.h).
double measure_gemm_gflops(int64_t M, int64_t N, int64_t K, double seconds);
double measure_gemm_bf16_gflops(int64_t M, int64_t N, int64_t K, double seconds);

// Whether oneDNN multiplies bf16 natively on this CPU (AVX-512 bf16/AMX); otherwise gemm_bf16 widens
// its operands to f32 first and runs the f32 kernel (correct, at f32 speed plus the conversion).
bool gemm_bf16_native();

// Whether bf16-stored weights are multiplied as bf16 (gemm_bf16 on the weight itself, the f32
// activations rounded to bf16 per call, as PyTorch's bf16 does; f32 accumulation and results) rather
// than widened to an f32 copy first. gemm_bf16_native() decides, unless KTUNE_BF16_GEMM says
// `widen` (force the f32 path, for comparison) or `bf16` (force bf16 operands even where gemm_bf16
// widens internally: tests on CPUs without bf16 units). Read on every call, so a test may switch it;
// the decoder plans its scratch for the answer and plans again when it changes.
bool bf16_weights_use_bf16_gemm();

// Number of oneDNN primitives cached so far (tests check that repeated shapes reuse them).
int64_t gemm_cached_primitives();

}  // namespace ktune::cpu
