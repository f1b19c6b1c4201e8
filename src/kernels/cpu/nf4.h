// QLoRA's 4-bit NormalFloat (NF4) as torchao's NF4Tensor makes it (torchtune's QLoRA: to_nf4 with
// blocks of 64 and scaler blocks of 256), so that an NF4 base is torchtune's to the bit:
//   codes   each value of a block of 64 over the flattened tensor, divided by the block's absmax, to the
//           nearest of torchao's 16 code values (the first on a tie; a block of zeros, 0/0, takes code 0),
//           two codes a byte, the first value in the high nibble;
//   scales  double quantised: the blocks' absmax less their mean over the tensor, in groups of 256 blocks
//           to int8 by 256 / (2 · the group's largest |·|), and back: scale = q / factor + mean.
// The arithmetic is torchao's in the weight's dtype (Nf4Arithmetic): under bf16 every operation rounds
// to bf16 as PyTorch's bf16 tensors do (the weight itself read as its bf16 rounding, the codes' values
// rounded to bf16, a value dequantised to bf16(code · scale)); under f32 plainly in f32.
// Stored: the codes and each block's scale as an f32 (the dequantised double-quantised scaler, as
// torchao computes it before each use), not torchao's int8 scalers: 4.5 bits a value, not 4.13 (the GPU
// step holds them as bf16, which in bf16 arithmetic they are: 4.25).
// A tensor whose block count is not a multiple of 256 (torchao refuses one) ends in a shorter group.
// The linear ops dequantise a block of weight rows at a time into caller scratch and multiply with
// gemm(): the f32 weight never exists in full.
// The code tables and the quantiser (nf4_codes.cpp) need only src/core; the linear ops (nf4.cpp) the GEMM.
// It deliberately does not do FP4, nor bitsandbytes' own quantiser (its exact code values and f32
// scales, where torchao's table is written to 4 decimals: code 6 differs once rounded to bf16).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace ktune::cpu {

// torchao's 16 NF4 code values (torchao.dtypes.nf4tensor, NF4Tensor.from_tensor) as f32, and the same
// rounded to bf16 (the table a bf16 weight's quantiser and dequantiser use). Initialisers, so that the
// CPU's tables and the GPU's __constant__ copies (kernels/cuda/nf4.cu, nf4_gemm.cu) cannot drift apart.
#define KTUNE_NF4_CODE_VALUES \
  {-1.0f, -0.6962f, -0.5251f, -0.3949f, -0.2844f, -0.1848f, -0.0911f, 0.0f, \
   0.0796f, 0.1609f, 0.2461f, 0.3379f, 0.4407f, 0.5626f, 0.7230f, 1.0f}
#define KTUNE_NF4_CODE_VALUES_BF16                                                                    \
  {-1.0f, -0.6953125f, -0.5234375f, -0.39453125f, -0.28515625f, -0.1845703125f, -0.09130859375f, 0.0f, \
   0.07958984375f, 0.1611328125f, 0.24609375f, 0.337890625f, 0.44140625f, 0.5625f, 0.72265625f, 1.0f}

extern const float kNf4Codes[16];      // f32
extern const float kNf4CodesBf16[16];  // KTUNE_NF4_CODE_VALUES rounded to bf16
constexpr int64_t kNf4BlockSize = 64;
constexpr int64_t kNf4ScalerBlockSize = 256;  // blocks whose scales share one int8 quantisation factor

// The dtype torchao computes NF4 in: the weight's. torchtune's QLoRA quantises its model's weights as
// the model holds them: bf16 under dtype=bf16 (and on a GPU, always), f32 under dtype=fp32.
enum class Nf4Arithmetic : uint8_t { kBf16, kF32 };
const char* nf4_arithmetic_name(Nf4Arithmetic arithmetic);  // "bf16", "f32"

// Throws ktune::Error unless n is a whole number of 64-blocks.
void nf4_check_blocks(int64_t n);

// x (n) -> codes (n/2 bytes), scales (n/64). n % 64 == 0 (throws ktune::Error otherwise).
void nf4_quantize(uint8_t* codes, float* scales, const float* x, int64_t n, Nf4Arithmetic arithmetic);
// The quantiser's two steps, for a tensor read a piece at a time:
//   nf4_quantize_blocks: the codes of whole blocks and each block's absmax (x (n), codes (n/2), absmax (n/64));
//   nf4_block_absmax:    the absmax alone (a block whose codes another rank makes);
//   nf4_double_quantize_scales: the tensor's every block's absmax (blocks) -> its scales, in place.
void nf4_quantize_blocks(uint8_t* codes, float* absmax, const float* x, int64_t n, Nf4Arithmetic arithmetic);
void nf4_block_absmax(float* absmax, const float* x, int64_t n, Nf4Arithmetic arithmetic);
void nf4_double_quantize_scales(float* scales, int64_t blocks, Nf4Arithmetic arithmetic);

// The result of one tensor operation as the arithmetic holds it: rounded to bf16 under bf16.
inline float nf4_rounded(float x, Nf4Arithmetic arithmetic) {
  return arithmetic == Nf4Arithmetic::kBf16 ? bf16_to_f32(f32_to_bf16(x)) : x;
}
// The arithmetic's code values: kNf4CodesBf16 under bf16, kNf4Codes under f32.
inline const float* nf4_code_table(Nf4Arithmetic arithmetic) {
  return arithmetic == Nf4Arithmetic::kBf16 ? kNf4CodesBf16 : kNf4Codes;
}

// One value dequantised: bf16(code value · scale) under bf16 (exact in f32 before the rounding: both
// factors are bf16 values), code value · scale in f32 under f32.
inline float nf4_value(uint8_t code, float scale, Nf4Arithmetic arithmetic) {
  return nf4_rounded(nf4_code_table(arithmetic)[code] * scale, arithmetic);
}

void nf4_dequantize(float* x, const uint8_t* codes, const float* scales, int64_t n, Nf4Arithmetic arithmetic);
// Elements [begin, end) of the flattened tensor (any bounds) into x (end - begin).
void nf4_dequantize_range(float* x, const uint8_t* codes, const float* scales, int64_t begin, int64_t end,
                          Nf4Arithmetic arithmetic);

// Floats of scratch the two linear ops need (a block of whole rows of W).
size_t nf4_linear_scratch_floats(int64_t in, int64_t out);
// y (N, out) = x (N, in) @ dequant(W)^T,  W (out, in) in NF4 (out*in % 64 == 0).
void nf4_linear_forward(float* y, const float* x, const uint8_t* codes, const float* scales, int64_t N, int64_t in,
                        int64_t out, Nf4Arithmetic arithmetic, float* scratch);
// Undoes y = x @ W^T for x: dx (N, in) = dy (N, out) @ dequant(W) (overwritten, or added when accumulate_dx).
void nf4_linear_backward_input(float* dx, const float* dy, const uint8_t* codes, const float* scales, int64_t N,
                               int64_t in, int64_t out, Nf4Arithmetic arithmetic, float* scratch, bool accumulate_dx);

// torchao's codes written out plainly, an element and an operation at a time (each value's 16
// distances in turn), and the scales by nf4_double_quantize_scales (itself plain, held to torchao by the
// tests' fixture): what the tests hold nf4_quantize's blockwise codes to.
void nf4_quantize_reference(uint8_t* codes, float* scales, const float* x, int64_t n, Nf4Arithmetic arithmetic);

}  // namespace ktune::cpu
