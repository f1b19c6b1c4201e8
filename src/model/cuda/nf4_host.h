// QLoRA's NF4 quantisation on the host, for cuda::Decoder's frozen base weights: a transcription of
// cpu::nf4_quantize and cpu::nf4_dequantize (src/kernels/cpu/nf4.cpp), whose file cannot be compiled
// into the CUDA library (its linear ops call the oneDNN GEMM and its loops OpenMP; the CUDA-only tree
// has neither). Same layout (blocks of 64 over the flattened tensor, an f32 absmax scale per block,
// two codes a byte, first value in the high nibble), same code table and the same f32 arithmetic in
// the same order (absmax, 1/absmax, the count of code midpoints below x/absmax), so the codes equal
// the CPU engine's bit for bit. Weights are quantised once, when they are uploaded.
// It deliberately does not quantise on the GPU, nor double-quantise the scales (as the CPU op).
#pragma once

#include <cstdint>

namespace ktune::cuda {

constexpr int64_t kNf4BlockSize = 64;

// The 16 NF4 code values (cpu::kNf4Codes).
extern const float kNf4CodeValues[16];

// x (n) -> codes (n/2 bytes), scales (n/64). n % 64 == 0 (throws ktune::Error otherwise).
void nf4_quantize_on_host(uint8_t* codes, float* scales, const float* x, int64_t n);
// x (n) = code value * scale of its block. n % 64 == 0.
void nf4_dequantize_on_host(float* x, const uint8_t* codes, const float* scales, int64_t n);

}  // namespace ktune::cuda
