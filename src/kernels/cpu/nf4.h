// QLoRA's 4-bit NormalFloat (NF4), as bitsandbytes stores it: blocks of 64 over the flattened
// tensor, an f32 absmax scale per block, each value the nearest of 16 codes (kNf4Codes), two codes
// a byte with the first value in the high nibble. The linear ops dequantise a block of weight rows
// at a time into caller scratch and multiply with gemm(): the f32 weight never exists in full.
// The code table and the quantiser (nf4_codes.cpp) need only src/core; the linear ops (nf4.cpp) the GEMM.
// It deliberately does not do double quantisation of the scales, nor FP4.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ktune::cpu {

// The 16 NF4 code values (bitsandbytes' table) as an initialiser: the CPU's kNf4Codes and the GPU's
// __constant__ copy (kernels/cuda/nf4.cu) are both written from it, so they cannot drift apart.
#define KTUNE_NF4_CODE_VALUES \
  {-1.0f,                 \
   -0.6961928009986877f,   \
   -0.5250730514526367f,   \
   -0.39491748809814453f,  \
   -0.28444138169288635f,  \
   -0.18477343022823334f,  \
   -0.09105003625154495f,  \
   0.0f,                   \
   0.07958029955625534f,   \
   0.16093020141124725f,   \
   0.24611230194568634f,   \
   0.33791524171829224f,   \
   0.44070982933044434f,   \
   0.5626170039176941f,    \
   0.7229568362236023f,    \
   1.0f}

extern const float kNf4Codes[16];
constexpr int64_t kNf4BlockSize = 64;

// Throws ktune::Error unless n is a whole number of 64-blocks.
void nf4_check_blocks(int64_t n);

// x (n) -> codes (n/2 bytes), scales (n/64). n % 64 == 0 (throws ktune::Error otherwise).
void nf4_quantize(uint8_t* codes, float* scales, const float* x, int64_t n);
void nf4_dequantize(float* x, const uint8_t* codes, const float* scales, int64_t n);
// Elements [begin, end) of the flattened tensor (any bounds) into x (end - begin).
void nf4_dequantize_range(float* x, const uint8_t* codes, const float* scales, int64_t begin, int64_t end);

// Floats of scratch the two linear ops need (a block of whole rows of W).
size_t nf4_linear_scratch_floats(int64_t in, int64_t out);
// y (N, out) = x (N, in) @ dequant(W)^T,  W (out, in) in NF4 (out*in % 64 == 0).
void nf4_linear_forward(float* y, const float* x, const uint8_t* codes, const float* scales, int64_t N, int64_t in,
                        int64_t out, float* scratch);
// Undoes y = x @ W^T for x: dx (N, in) = dy (N, out) @ dequant(W) (overwritten, or added when accumulate_dx).
void nf4_linear_backward_input(float* dx, const float* dy, const uint8_t* codes, const float* scales, int64_t N,
                               int64_t in, int64_t out, float* scratch, bool accumulate_dx);

void nf4_quantize_reference(uint8_t* codes, float* scales, const float* x, int64_t n);

}  // namespace ktune::cpu
