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
// Stored as torchao stores them (Nf4Scales): the codes, each block's int8 scaler, each group's factor
// and the tensor's mean, 4.127 bits a value; a block's scale is made again where it is used (one
// division and one addition a block of 64). The f32 form of the scales (nf4_quantize's float overloads,
// nf4_double_quantize_scales) is what the GPU step uploads as bf16 (4.25 bits there) and what the tests
// compare with torchao's dequantised scalers.
// A tensor whose block count is not a multiple of 256 (torchao refuses one) ends in a shorter group.
// The linear ops dequantise a block of weight rows at a time into caller scratch and multiply with
// gemm(): the f32 weight never exists in full.
// The code tables and the quantiser (nf4_codes.cpp) need only src/core; the linear ops (nf4.cpp) the GEMM.
// It deliberately does not do FP4, nor bitsandbytes' own quantiser (its exact code values and f32
// scales, where torchao's table is written to 4 decimals: code 6 differs once rounded to bf16).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

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

// The result of one tensor operation as the arithmetic holds it: rounded to bf16 under bf16.
inline float nf4_rounded(float x, Nf4Arithmetic arithmetic) {
  return arithmetic == Nf4Arithmetic::kBf16 ? bf16_to_f32(f32_to_bf16(x)) : x;
}

// Groups of kNf4ScalerBlockSize blocks (the last one shorter) in a tensor of `blocks` blocks.
inline int64_t nf4_scale_groups(int64_t blocks) { return (blocks + kNf4ScalerBlockSize - 1) / kNf4ScalerBlockSize; }

// A tensor's block scales double quantised, as torchao's NF4Tensor holds them (quantized_scalers,
// quantization_factor, scaler_mean), each value the arithmetic's (a bf16 value under bf16).
struct Nf4Scales {
  std::vector<int8_t> quantized;  // (blocks) each block's absmax less the mean, times its group's factor, rounded
  std::vector<float> factors;     // (groups) 256 / (2 · the group's largest |absmax - mean|); may be inf
  float mean = 0.0f;              // the blocks' mean absmax

  Nf4Scales() = default;
  explicit Nf4Scales(int64_t blocks) : quantized(size_t(blocks)), factors(size_t(nf4_scale_groups(blocks))) {}
  int64_t blocks() const { return int64_t(quantized.size()); }
  size_t bytes() const { return quantized.empty() ? 0 : quantized.size() + (factors.size() + 1) * sizeof(float); }
  // Block b's scale, torchao's dequantize_scalers: q / factor + mean, each step in the arithmetic (a
  // group whose factor is inf gives the mean).
  float scale(int64_t b, Nf4Arithmetic arithmetic) const {
    const float q = float(quantized[size_t(b)]);
    return nf4_rounded(nf4_rounded(q / factors[size_t(b / kNf4ScalerBlockSize)], arithmetic) + mean, arithmetic);
  }
};

// x (n) -> codes (n/2 bytes) and scales (n/64 blocks, resized here). n % 64 == 0 (throws ktune::Error otherwise).
void nf4_quantize(uint8_t* codes, Nf4Scales& scales, const float* x, int64_t n, Nf4Arithmetic arithmetic);
// The same with each block's scale as an f32 (scales (n/64): Nf4Scales::scale of every block).
void nf4_quantize(uint8_t* codes, float* scales, const float* x, int64_t n, Nf4Arithmetic arithmetic);
// The quantiser's two steps, for a tensor read a piece at a time:
//   nf4_quantize_blocks: the codes of whole blocks and each block's absmax (x (n), codes (n/2), absmax (n/64));
//   nf4_block_absmax:    the absmax alone (a block whose codes another rank makes);
//   nf4_double_quantize: the tensor's every block's absmax (blocks) -> its scales (resized here);
//   nf4_double_quantize_scales: the same, each block's scale written as an f32 over its absmax, in place.
void nf4_quantize_blocks(uint8_t* codes, float* absmax, const float* x, int64_t n, Nf4Arithmetic arithmetic);
void nf4_block_absmax(float* absmax, const float* x, int64_t n, Nf4Arithmetic arithmetic);
void nf4_double_quantize(Nf4Scales& scales, const float* absmax, int64_t blocks, Nf4Arithmetic arithmetic);
void nf4_double_quantize_scales(float* scales, int64_t blocks, Nf4Arithmetic arithmetic);
// The arithmetic's code values: kNf4CodesBf16 under bf16, kNf4Codes under f32.
inline const float* nf4_code_table(Nf4Arithmetic arithmetic) {
  return arithmetic == Nf4Arithmetic::kBf16 ? kNf4CodesBf16 : kNf4Codes;
}

// One value dequantised: bf16(code value · scale) under bf16 (exact in f32 before the rounding: both
// factors are bf16 values), code value · scale in f32 under f32.
inline float nf4_value(uint8_t code, float scale, Nf4Arithmetic arithmetic) {
  return nf4_rounded(nf4_code_table(arithmetic)[code] * scale, arithmetic);
}

// x (n) = the tensor's values; scales held as torchao holds them, or as f32s (one a block).
void nf4_dequantize(float* x, const uint8_t* codes, const Nf4Scales& scales, int64_t n, Nf4Arithmetic arithmetic);
void nf4_dequantize(float* x, const uint8_t* codes, const float* scales, int64_t n, Nf4Arithmetic arithmetic);
// Elements [begin, end) of the flattened tensor (any bounds) into x (end - begin).
void nf4_dequantize_range(float* x, const uint8_t* codes, const Nf4Scales& scales, int64_t begin, int64_t end,
                          Nf4Arithmetic arithmetic);
void nf4_dequantize_range(float* x, const uint8_t* codes, const float* scales, int64_t begin, int64_t end,
                          Nf4Arithmetic arithmetic);

// Floats of scratch the two linear ops need (a block of whole rows of W).
size_t nf4_linear_scratch_floats(int64_t in, int64_t out);
// y (N, out) = x (N, in) @ dequant(W)^T,  W (out, in) in NF4 (out*in % 64 == 0).
void nf4_linear_forward(float* y, const float* x, const uint8_t* codes, const Nf4Scales& scales, int64_t N, int64_t in,
                        int64_t out, Nf4Arithmetic arithmetic, float* scratch);
// Undoes y = x @ W^T for x: dx (N, in) = dy (N, out) @ dequant(W) (overwritten, or added when accumulate_dx).
void nf4_linear_backward_input(float* dx, const float* dy, const uint8_t* codes, const Nf4Scales& scales, int64_t N,
                               int64_t in, int64_t out, Nf4Arithmetic arithmetic, float* scratch, bool accumulate_dx);

// torchao's codes written out plainly, an element and an operation at a time (each value's 16
// distances in turn), and the scales by nf4_double_quantize_scales (itself plain, held to torchao by the
// tests' fixture): what the tests hold nf4_quantize's blockwise codes to.
void nf4_quantize_reference(uint8_t* codes, float* scales, const float* x, int64_t n, Nf4Arithmetic arithmetic);

}  // namespace ktune::cpu
