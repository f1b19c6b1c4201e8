// NF4 quantisation as torchao's NF4Tensor.from_tensor does it (nf4.h): the code tables, the codes, the
// double-quantised scales, and dequantising. Plain C++ over src/core only (no GEMM), so that the CUDA
// backend compiles this very file in (src/model/cuda: the GPU step quantises QLoRA's bases on the host
// with it) and its codes and scales are the CPU engine's.
// torchao's steps, each a PyTorch tensor operation in the weight's dtype (bf16: computed in f32, the
// result rounded to bf16, as PyTorch's bf16 kernels do):
//   absmax  = max |x| over each block of 64
//   code    = argmin_c |x / absmax - code_c|            (the first on a tie; NaN, 0/0: code 0)
//   mean    = mean(absmax) over the tensor              (summed in double, rounded to f32, / count;
//                                                        torch's f32 sum may end an ulp from it)
//   centred = absmax - mean
//   factor  = 256 / (2 · max |centred| over each group of 256 blocks)
//   q       = clamp(round_half_even(centred · factor), -128, 127)   (int8)
//   scale   = q / factor + mean                         (what the dequantiser multiplies by)
#include "kernels/cpu/nf4.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"

namespace ktune::cpu {

const float kNf4Codes[16] = KTUNE_NF4_CODE_VALUES;
const float kNf4CodesBf16[16] = KTUNE_NF4_CODE_VALUES_BF16;

const char* nf4_arithmetic_name(Nf4Arithmetic arithmetic) {
  return arithmetic == Nf4Arithmetic::kBf16 ? "bf16" : "f32";
}

namespace {

// torchao's quantize_tensor_nearest for one scaled value v: the code whose distance |v - code|,
// computed in the arithmetic, is least; the first of equals (torch's min); code 0 for NaN (torch's min
// gives the index of the first NaN, and every distance of a NaN is NaN).
uint8_t nearest_code(float v, Nf4Arithmetic arithmetic) {
  const float* table = nf4_code_table(arithmetic);
  uint8_t best = 0;
  float best_distance = std::fabs(nf4_rounded(v - table[0], arithmetic));
  for (uint8_t c = 1; c < 16; ++c) {
    const float distance = std::fabs(nf4_rounded(v - table[c], arithmetic));
    if (distance < best_distance) best = c, best_distance = distance;  // false for NaN: code 0 stays
  }
  return best;
}

// Under bf16 a scaled value is one of 65536 bf16 values: its code, looked up by its bits.
const std::array<uint8_t, 65536>& bf16_codes() {
  static const auto table = [] {
    std::array<uint8_t, 65536> t{};
    for (uint32_t bits = 0; bits < 65536; ++bits) t[bits] = nearest_code(bf16_to_f32(bf16_t(bits)), Nf4Arithmetic::kBf16);
    return t;
  }();
  return table;
}

// One 64-value block: its values as the arithmetic holds them (x), and their absmax.
float block_values(float* x, const float* xb, Nf4Arithmetic arithmetic) {
  float absmax = 0.0f;
  for (int64_t i = 0; i < kNf4BlockSize; ++i) {
    x[i] = nf4_rounded(xb[i], arithmetic);
    absmax = std::max(absmax, std::fabs(x[i]));
  }
  return absmax;
}

// One block's codes (two a byte, the first in the high nibble) and its absmax into *absmax. bf16: each
// scaled value's code from the table of bf16 values; f32: the 16 distances a code at a time across the
// block (the compiler vectorises it), the codes of nearest_code bit for bit.
void quantize_block(uint8_t* codes, float* absmax, const float* xb, Nf4Arithmetic arithmetic) {
  float x[kNf4BlockSize];
  *absmax = block_values(x, xb, arithmetic);
  const float m = *absmax;
  uint8_t code[kNf4BlockSize];
  if (arithmetic == Nf4Arithmetic::kBf16) {
    const std::array<uint8_t, 65536>& table = bf16_codes();
    for (int64_t i = 0; i < kNf4BlockSize; ++i) code[i] = table[f32_to_bf16(x[i] / m)];
  } else {
    float v[kNf4BlockSize], best[kNf4BlockSize];
    for (int64_t i = 0; i < kNf4BlockSize; ++i) {
      v[i] = x[i] / m;
      best[i] = std::fabs(v[i] - kNf4Codes[0]);
      code[i] = 0;
    }
    for (uint8_t c = 1; c < 16; ++c) {
      for (int64_t i = 0; i < kNf4BlockSize; ++i) {
        const float distance = std::fabs(v[i] - kNf4Codes[c]);
        const bool closer = distance < best[i];
        best[i] = closer ? distance : best[i];
        code[i] = closer ? c : code[i];
      }
    }
  }
  for (int64_t i = 0; i < kNf4BlockSize; i += 2) codes[i / 2] = uint8_t(code[i] << 4 | code[i + 1]);
}

// q of one centred scale: round half to even (torch.round), clamped to int8. 0 for 0 · inf (a group
// whose scales all equal the mean: its factor is infinite, and any q dequantises to the mean).
float quantized_scaler(float centred, float factor, Nf4Arithmetic arithmetic) {
  const float q = std::nearbyint(nf4_rounded(centred * factor, arithmetic));
  return std::isnan(q) ? 0.0f : std::clamp(q, -128.0f, 127.0f);
}

// Elements [begin, end) into x, a block at a time: its scale (scale_of(block)) once, then its values.
template <Nf4Arithmetic kArithmetic, class ScaleOf>
void dequantize_range(float* x, const uint8_t* codes, const ScaleOf& scale_of, int64_t begin, int64_t end) {
  for (int64_t first = begin; first < end;) {
    const int64_t block = first / kNf4BlockSize, last = std::min(end, (block + 1) * kNf4BlockSize);
    const float scale = scale_of(block);
    for (int64_t i = first; i < last; ++i) {
      const uint8_t byte = codes[i >> 1];
      const uint8_t code = (i & 1) ? (byte & 0x0f) : (byte >> 4);
      x[i - begin] = nf4_value(code, scale, kArithmetic);
    }
    first = last;
  }
}

template <class ScaleOf>
void dequantize_range_in(Nf4Arithmetic arithmetic, float* x, const uint8_t* codes, const ScaleOf& scale_of,
                         int64_t begin, int64_t end) {
  if (arithmetic == Nf4Arithmetic::kBf16)
    dequantize_range<Nf4Arithmetic::kBf16>(x, codes, scale_of, begin, end);
  else
    dequantize_range<Nf4Arithmetic::kF32>(x, codes, scale_of, begin, end);
}

}  // namespace

void nf4_check_blocks(int64_t n) {
  check(n % kNf4BlockSize == 0, "nf4", "tensor of " + std::to_string(n) + " elements is not a whole number of 64-blocks");
}

void nf4_quantize_blocks(uint8_t* codes, float* absmax, const float* x, int64_t n, Nf4Arithmetic arithmetic) {
  nf4_check_blocks(n);
  parallel_for(n / kNf4BlockSize, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      quantize_block(codes + b * kNf4BlockSize / 2, absmax + b, x + b * kNf4BlockSize, arithmetic);
  }, 64);
}

void nf4_block_absmax(float* absmax, const float* x, int64_t n, Nf4Arithmetic arithmetic) {
  nf4_check_blocks(n);
  parallel_for(n / kNf4BlockSize, [&](int64_t b0, int64_t b1) {
    float values[kNf4BlockSize];
    for (int64_t b = b0; b < b1; ++b) absmax[b] = block_values(values, x + b * kNf4BlockSize, arithmetic);
  }, 64);
}

void nf4_double_quantize(Nf4Scales& scales, const float* absmax, int64_t blocks, Nf4Arithmetic arithmetic) {
  scales = Nf4Scales(blocks);
  if (blocks == 0) return;
  double sum = 0;
  for (int64_t b = 0; b < blocks; ++b) sum += absmax[b];
  scales.mean = nf4_rounded(float(sum) / float(blocks), arithmetic);
  float centred[kNf4ScalerBlockSize];
  for (int64_t g0 = 0; g0 < blocks; g0 += kNf4ScalerBlockSize) {
    const int64_t size = std::min(kNf4ScalerBlockSize, blocks - g0);
    float largest = 0.0f;
    for (int64_t i = 0; i < size; ++i) {
      centred[i] = nf4_rounded(absmax[g0 + i] - scales.mean, arithmetic);
      largest = std::max(largest, std::fabs(centred[i]));
    }
    const float factor = nf4_rounded(256.0f / nf4_rounded(2.0f * largest, arithmetic), arithmetic);
    scales.factors[size_t(g0 / kNf4ScalerBlockSize)] = factor;
    for (int64_t i = 0; i < size; ++i) scales.quantized[size_t(g0 + i)] = int8_t(quantized_scaler(centred[i], factor, arithmetic));
  }
}

void nf4_double_quantize_scales(float* scales, int64_t blocks, Nf4Arithmetic arithmetic) {
  Nf4Scales held;
  nf4_double_quantize(held, scales, blocks, arithmetic);
  for (int64_t b = 0; b < blocks; ++b) scales[b] = held.scale(b, arithmetic);
}

void nf4_quantize(uint8_t* codes, Nf4Scales& scales, const float* x, int64_t n, Nf4Arithmetic arithmetic) {
  std::vector<float> absmax(size_t(std::max<int64_t>(0, n / kNf4BlockSize)));
  nf4_quantize_blocks(codes, absmax.data(), x, n, arithmetic);
  nf4_double_quantize(scales, absmax.data(), n / kNf4BlockSize, arithmetic);
}

void nf4_quantize(uint8_t* codes, float* scales, const float* x, int64_t n, Nf4Arithmetic arithmetic) {
  nf4_quantize_blocks(codes, scales, x, n, arithmetic);
  nf4_double_quantize_scales(scales, n / kNf4BlockSize, arithmetic);
}

void nf4_dequantize_range(float* x, const uint8_t* codes, const Nf4Scales& scales, int64_t begin, int64_t end,
                          Nf4Arithmetic arithmetic) {
  dequantize_range_in(arithmetic, x, codes, [&](int64_t b) { return scales.scale(b, arithmetic); }, begin, end);
}

void nf4_dequantize_range(float* x, const uint8_t* codes, const float* scales, int64_t begin, int64_t end,
                          Nf4Arithmetic arithmetic) {
  dequantize_range_in(arithmetic, x, codes, [&](int64_t b) { return scales[b]; }, begin, end);
}

namespace {

template <class Scales>
void dequantize_whole(float* x, const uint8_t* codes, const Scales& scales, int64_t n, Nf4Arithmetic arithmetic) {
  nf4_check_blocks(n);
  parallel_for(n / kNf4BlockSize, [&](int64_t b0, int64_t b1) {
    nf4_dequantize_range(x + b0 * kNf4BlockSize, codes, scales, b0 * kNf4BlockSize, b1 * kNf4BlockSize, arithmetic);
  }, 64);
}

}  // namespace

void nf4_dequantize(float* x, const uint8_t* codes, const Nf4Scales& scales, int64_t n, Nf4Arithmetic arithmetic) {
  dequantize_whole(x, codes, scales, n, arithmetic);
}

void nf4_dequantize(float* x, const uint8_t* codes, const float* scales, int64_t n, Nf4Arithmetic arithmetic) {
  dequantize_whole(x, codes, scales, n, arithmetic);
}

void nf4_quantize_reference(uint8_t* codes, float* scales, const float* x, int64_t n, Nf4Arithmetic arithmetic) {
  nf4_check_blocks(n);
  for (int64_t b = 0; b < n / kNf4BlockSize; ++b) {
    float absmax = 0.0f;
    for (int64_t i = 0; i < kNf4BlockSize; ++i)
      absmax = std::max(absmax, std::fabs(nf4_rounded(x[b * kNf4BlockSize + i], arithmetic)));
    scales[b] = absmax;
    for (int64_t i = 0; i < kNf4BlockSize; ++i) {
      const int64_t e = b * kNf4BlockSize + i;
      const uint8_t code = nearest_code(nf4_rounded(nf4_rounded(x[e], arithmetic) / absmax, arithmetic), arithmetic);
      codes[e / 2] = e % 2 == 0 ? uint8_t(code << 4) : uint8_t(codes[e / 2] | code);
    }
  }
  nf4_double_quantize_scales(scales, n / kNf4BlockSize, arithmetic);
}

}  // namespace ktune::cpu
