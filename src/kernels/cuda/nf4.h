// QLoRA's NF4 on the GPU, in the CPU op's layout (kernels/cpu/nf4.h, torchao's NF4 in bf16 arithmetic):
// blocks of 64 over the flattened tensor, a scale per block (torchao's double-quantised scale, a bf16
// value, so held as bf16: 4.25 bits a weight), two codes a byte, first value in the high nibble. Dequantisation to bf16 (for the tensor-core
// GEMM: bf16(code * scale), torchao's value) or f32 (the exact product), and the frozen-base linear
// y = x @ dequant(W)^T that dequantises W into caller scratch and runs one cuBLASLt GEMM.
// It deliberately does not quantise on the GPU (weights are quantised once, on load, by the CPU
// code). The GEMM with the dequantisation fused into its main loop is nf4_gemm.h; this path is its
// reference, and the decoder's default.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "kernels/cuda/gemm.h"

namespace ktune::cuda {

// x (n) = code value * scale of its block.   codes (n/2 bytes)   scales (n/64)   n % 64 == 0
void nf4_dequantize(float* x, const uint8_t* codes, const bf16_t* scales, int64_t n, Stream stream = nullptr);
void nf4_dequantize(bf16_t* x, const uint8_t* codes, const bf16_t* scales, int64_t n, Stream stream = nullptr);

// y (N, out) f32 = x (N, in) bf16 @ dequant(W)^T,  W (out, in) NF4; scratch: out*in bf16 values.
void nf4_linear_forward(GemmContext& ctx, float* y, const bf16_t* x, const uint8_t* codes, const bf16_t* scales,
                        int64_t N, int64_t in, int64_t out, bf16_t* scratch, Stream stream = nullptr);
// Undoes y = x @ W^T for x: dx (N, in) f32 = dy (N, out) bf16 @ dequant(W) (overwritten, or added when accumulate_dx).
void nf4_linear_backward_input(GemmContext& ctx, float* dx, const bf16_t* dy, const uint8_t* codes, const bf16_t* scales,
                               int64_t N, int64_t in, int64_t out, bf16_t* scratch, bool accumulate_dx,
                               Stream stream = nullptr);

}  // namespace ktune::cuda
