// NF4 quantisation (bitsandbytes layout): the code table, quantising and dequantising. Plain C++ over
// src/core only (no GEMM), so that the CUDA backend compiles this very file in (src/model/cuda:
// the GPU step quantises QLoRA's bases on the host with it) and its codes are the CPU engine's.
// Quantisation picks the nearest code by comparing against the midpoints between neighbouring
// codes (as bitsandbytes' dQuantizeNF4 does); an all-zero block gets scale 0 and code 0.0 (index 7).
#include "kernels/cpu/nf4.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <string>

#include "core/error.h"
#include "core/parallel.h"

namespace ktune::cpu {

const float kNf4Codes[16] = KTUNE_NF4_CODE_VALUES;

namespace {

// The 15 midpoints between neighbouring codes: a value's nearest code is the count of them below it.
const std::array<float, 15>& code_midpoints() {
  static const auto midpoints = [] {
    std::array<float, 15> m{};
    for (int i = 0; i < 15; ++i) m[size_t(i)] = 0.5f * (kNf4Codes[i] + kNf4Codes[i + 1]);
    return m;
  }();
  return midpoints;
}

// One 64-value block: its absmax into *scale, its codes (two a byte, the first in the high nibble).
// Each value scaled by 1/absmax, then counted against every midpoint, a midpoint at a time across
// the block (the compiler vectorises the count: 16 lanes a compare on AVX-512, where a value at a
// time took 15 dependent compares): the codes of nf4_quantize_reference, bit for bit.
void quantize_block(uint8_t* codes, float* scale, const float* xb, const std::array<float, 15>& midpoints) {
  float absmax = 0.0f;
  for (int64_t i = 0; i < kNf4BlockSize; ++i) absmax = std::max(absmax, std::fabs(xb[i]));
  *scale = absmax;
  const float inv = absmax > 0.0f ? 1.0f / absmax : 0.0f;
  float v[kNf4BlockSize];
  uint8_t code[kNf4BlockSize];
  for (int64_t i = 0; i < kNf4BlockSize; ++i) {
    v[i] = xb[i] * inv;
    code[i] = 0;
  }
  for (int m = 0; m < 15; ++m) {
    const float midpoint = midpoints[size_t(m)];
    for (int64_t i = 0; i < kNf4BlockSize; ++i) code[i] = uint8_t(code[i] + (v[i] > midpoint ? 1 : 0));
  }
  for (int64_t i = 0; i < kNf4BlockSize; i += 2) codes[i / 2] = uint8_t(code[i] << 4 | code[i + 1]);
}

}  // namespace

void nf4_check_blocks(int64_t n) {
  check(n % kNf4BlockSize == 0, "nf4", "tensor of " + std::to_string(n) + " elements is not a whole number of 64-blocks");
}

void nf4_quantize(uint8_t* codes, float* scales, const float* x, int64_t n) {
  nf4_check_blocks(n);
  const std::array<float, 15>& midpoints = code_midpoints();
  parallel_for(n / kNf4BlockSize, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      quantize_block(codes + b * kNf4BlockSize / 2, scales + b, x + b * kNf4BlockSize, midpoints);
  }, 64);
}

void nf4_dequantize_range(float* x, const uint8_t* codes, const float* scales, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    uint8_t byte = codes[i >> 1];
    uint8_t code = (i & 1) ? (byte & 0x0f) : (byte >> 4);
    x[i - begin] = kNf4Codes[code] * scales[i / kNf4BlockSize];
  }
}

void nf4_dequantize(float* x, const uint8_t* codes, const float* scales, int64_t n) {
  nf4_check_blocks(n);
  parallel_for(n / kNf4BlockSize, [&](int64_t b0, int64_t b1) {
    nf4_dequantize_range(x + b0 * kNf4BlockSize, codes, scales, b0 * kNf4BlockSize, b1 * kNf4BlockSize);
  }, 64);
}

void nf4_quantize_reference(uint8_t* codes, float* scales, const float* x, int64_t n) {
  nf4_check_blocks(n);
  for (int64_t b = 0; b < n / kNf4BlockSize; ++b) {
    double absmax = 0;
    for (int64_t i = 0; i < kNf4BlockSize; ++i) absmax = std::max(absmax, std::fabs(double(x[b * kNf4BlockSize + i])));
    scales[b] = float(absmax);
    for (int64_t i = 0; i < kNf4BlockSize; ++i) {
      double v = absmax > 0 ? double(x[b * kNf4BlockSize + i]) / absmax : 0.0;
      int best = 0;
      for (int c = 1; c < 16; ++c)
        if (std::fabs(v - kNf4Codes[c]) < std::fabs(v - kNf4Codes[best])) best = c;
      int64_t e = b * kNf4BlockSize + i;
      if (e % 2 == 0)
        codes[e / 2] = uint8_t(best << 4);
      else
        codes[e / 2] |= uint8_t(best);
    }
  }
}

}  // namespace ktune::cpu
