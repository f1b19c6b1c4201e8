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

// Index of the nearest code to v in [-1, 1]: the count of midpoints below v.
inline uint8_t nearest_code(float v) {
  static const auto midpoints = [] {
    std::array<float, 15> m{};
    for (int i = 0; i < 15; ++i) m[size_t(i)] = 0.5f * (kNf4Codes[i] + kNf4Codes[i + 1]);
    return m;
  }();
  uint8_t code = 0;
  for (int i = 0; i < 15; ++i) code += uint8_t(v > midpoints[size_t(i)]);
  return code;
}

}  // namespace

void nf4_check_blocks(int64_t n) {
  check(n % kNf4BlockSize == 0, "nf4", "tensor of " + std::to_string(n) + " elements is not a whole number of 64-blocks");
}

void nf4_quantize(uint8_t* codes, float* scales, const float* x, int64_t n) {
  nf4_check_blocks(n);
  parallel_for(n / kNf4BlockSize, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const float* xb = x + b * kNf4BlockSize;
      float absmax = 0.0f;
      for (int64_t i = 0; i < kNf4BlockSize; ++i) absmax = std::max(absmax, std::fabs(xb[i]));
      scales[b] = absmax;
      float inv = absmax > 0.0f ? 1.0f / absmax : 0.0f;
      uint8_t* cb = codes + b * kNf4BlockSize / 2;
      for (int64_t i = 0; i < kNf4BlockSize; i += 2)
        cb[i / 2] = uint8_t(nearest_code(xb[i] * inv) << 4 | nearest_code(xb[i + 1] * inv));
    }
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
