// QLoRA's GEMM with the NF4 dequantisation fused in: C = alpha * A @ B + beta * C [+ bias], where B
// is a frozen NF4 weight W (kernels/cuda/nf4.h's layout: blocks of 64 over the flattened (rows, cols)
// tensor, an f32 absmax scale per block, first value in the high nibble) read straight from its
// codes. Each block of the kernel dequantises the (32 x 64) tile of W it is about to multiply into
// shared memory, rounded to bf16 as nf4_dequantize rounds it, and multiplies on the tensor cores
// (wmma bf16 16x16x16, f32 accumulators), so W never exists whole in bf16: no (out, in) scratch, and
// no write and read back of it in global memory.
//
// The plain path beside it, and its reference: nf4_dequantize into scratch, then cuBLASLt
// (nf4.h's nf4_linear_*). They multiply the same bf16 values; only the order of the f32 sums differs.
// This kernel is simple (64 x 64 tiles, 4 warps, no double buffering, no wgmma/TMA): which of the
// two is faster on a GPU is for bench/gpu (`ktune_gpu_gemm_bench`'s nf4 lines) to say; the decoder
// uses it only where asked (TrainingSetup::nf4_gemm, env KTUNE_CUDA_NF4_GEMM=fused).
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "kernels/cuda/gemm.h"  // Stream

namespace ktune::cuda {

struct Nf4GemmCall {
  int64_t M = 0, N = 0, K = 0;
  float alpha = 1.0f, beta = 0.0f;  // beta == 0 never reads C
  const bf16_t* A = nullptr;        // (M, K) row-major, packed, 16-byte aligned
  const uint8_t* codes = nullptr;   // W's NF4 codes (N*K/2 bytes)
  const bf16_t* scales = nullptr;   // W's block scales (N*K/64)
  // true (a linear's forward, y = x W^T): W is (N, K) and B(k, n) = W[n, k];
  // false (its input gradient, dx = dy W): W is (K, N) and B(k, n) = W[k, n].
  bool w_transposed = true;
  void* C = nullptr;               // (M, N) row-major, packed
  DType out = DType::F32;          // C: F32 or BF16 (rounded to nearest even from the f32 sum)
  const void* bias = nullptr;      // (N) in C's dtype, added to every row; nullptr: none
};

// The kernel's shape rules: N and K multiples of 64 (every projection of the model families ktune
// trains), M >= 0 any. The decoder falls back to the plain path where they do not hold.
bool nf4_gemm_supports(int64_t N, int64_t K);

// Asynchronous on `stream`. Throws ktune::Error ("cuda nf4 gemm", what is wrong) for shapes the
// kernel does not take, a misaligned A, or an F32/BF16 mismatch.
void nf4_gemm(const Nf4GemmCall& call, Stream stream = nullptr);

}  // namespace ktune::cuda
