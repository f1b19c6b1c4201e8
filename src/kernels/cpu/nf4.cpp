// NF4 quantisation (bitsandbytes layout) and the linear ops over NF4 weights.
// Quantisation picks the nearest code by comparing against the midpoints between neighbouring
// codes (as bitsandbytes' dQuantizeNF4 does); an all-zero block gets scale 0 and code 0.0 (index 7).
#include "kernels/cpu/nf4.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <string>

#include "core/error.h"
#include "core/parallel.h"
#include "kernels/cpu/gemm.h"

namespace ktune::cpu {

const float kNf4Codes[16] = {-1.0f,
                             -0.6961928009986877f,
                             -0.5250730514526367f,
                             -0.39491748809814453f,
                             -0.28444138169288635f,
                             -0.18477343022823334f,
                             -0.09105003625154495f,
                             0.0f,
                             0.07958029955625534f,
                             0.16093020141124725f,
                             0.24611230194568634f,
                             0.33791524171829224f,
                             0.44070982933044434f,
                             0.5626170039176941f,
                             0.7229568362236023f,
                             1.0f};

namespace {

constexpr int64_t kBlock = 64;

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

void check_blocks(int64_t n) {
  check(n % kBlock == 0, "nf4", "tensor of " + std::to_string(n) + " elements is not a whole number of 64-blocks");
}

}  // namespace

void nf4_quantize(uint8_t* codes, float* scales, const float* x, int64_t n) {
  check_blocks(n);
  parallel_for(n / kBlock, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const float* xb = x + b * kBlock;
      float absmax = 0.0f;
      for (int64_t i = 0; i < kBlock; ++i) absmax = std::max(absmax, std::fabs(xb[i]));
      scales[b] = absmax;
      float inv = absmax > 0.0f ? 1.0f / absmax : 0.0f;
      uint8_t* cb = codes + b * kBlock / 2;
      for (int64_t i = 0; i < kBlock; i += 2)
        cb[i / 2] = uint8_t(nearest_code(xb[i] * inv) << 4 | nearest_code(xb[i + 1] * inv));
    }
  }, 64);
}

void nf4_dequantize_range(float* x, const uint8_t* codes, const float* scales, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    uint8_t byte = codes[i >> 1];
    uint8_t code = (i & 1) ? (byte & 0x0f) : (byte >> 4);
    x[i - begin] = kNf4Codes[code] * scales[i / kBlock];
  }
}

void nf4_dequantize(float* x, const uint8_t* codes, const float* scales, int64_t n) {
  check_blocks(n);
  parallel_for(n / kBlock, [&](int64_t b0, int64_t b1) {
    nf4_dequantize_range(x + b0 * kBlock, codes, scales, b0 * kBlock, b1 * kBlock);
  }, 64);
}

namespace {

// Rows of W dequantised per GEMM: enough for a GEMM that runs near full rate, few enough to stay in L2.
int64_t rows_per_block(int64_t in, int64_t out) {
  int64_t rows = std::max<int64_t>(16, (int64_t(1) << 18) / std::max<int64_t>(1, in));  // ~1 MiB of f32
  return std::min(out, rows);
}

// Dequantises rows [r0, r1) of W (out, in) into scratch, threads splitting the elements.
void dequantize_rows(float* scratch, const uint8_t* codes, const float* scales, int64_t in, int64_t r0, int64_t r1) {
  const int64_t begin = r0 * in, count = (r1 - r0) * in;
  parallel_for(count, [&](int64_t e0, int64_t e1) {
    nf4_dequantize_range(scratch + e0, codes, scales, begin + e0, begin + e1);
  }, 16384);
}

}  // namespace

size_t nf4_linear_scratch_floats(int64_t in, int64_t out) { return size_t(rows_per_block(in, out) * in); }

void nf4_linear_forward(float* y, const float* x, const uint8_t* codes, const float* scales, int64_t N, int64_t in,
                        int64_t out, float* scratch) {
  check_blocks(in * out);
  const int64_t rows = rows_per_block(in, out);
  for (int64_t r0 = 0; r0 < out; r0 += rows) {
    int64_t r1 = std::min(out, r0 + rows);
    dequantize_rows(scratch, codes, scales, in, r0, r1);
    // y[:, r0:r1] = x (N, in) @ Wblock^T (in, r1-r0)
    gemm_strided(false, true, N, r1 - r0, in, 1.0f, x, in, scratch, in, 0.0f, y + r0, out);
  }
}

void nf4_linear_backward_input(float* dx, const float* dy, const uint8_t* codes, const float* scales, int64_t N,
                               int64_t in, int64_t out, float* scratch, bool accumulate_dx) {
  check_blocks(in * out);
  const int64_t rows = rows_per_block(in, out);
  for (int64_t r0 = 0; r0 < out; r0 += rows) {
    int64_t r1 = std::min(out, r0 + rows);
    dequantize_rows(scratch, codes, scales, in, r0, r1);
    // dx += dy[:, r0:r1] (N, r1-r0) @ Wblock (r1-r0, in)
    float beta = (r0 == 0 && !accumulate_dx) ? 0.0f : 1.0f;
    gemm_strided(false, false, N, in, r1 - r0, 1.0f, dy + r0, out, scratch, in, beta, dx, in);
  }
}

void nf4_quantize_reference(uint8_t* codes, float* scales, const float* x, int64_t n) {
  check_blocks(n);
  for (int64_t b = 0; b < n / kBlock; ++b) {
    double absmax = 0;
    for (int64_t i = 0; i < kBlock; ++i) absmax = std::max(absmax, std::fabs(double(x[b * kBlock + i])));
    scales[b] = float(absmax);
    for (int64_t i = 0; i < kBlock; ++i) {
      double v = absmax > 0 ? double(x[b * kBlock + i]) / absmax : 0.0;
      int best = 0;
      for (int c = 1; c < 16; ++c)
        if (std::fabs(v - kNf4Codes[c]) < std::fabs(v - kNf4Codes[best])) best = c;
      int64_t e = b * kBlock + i;
      if (e % 2 == 0)
        codes[e / 2] = uint8_t(best << 4);
      else
        codes[e / 2] |= uint8_t(best);
    }
  }
}

}  // namespace ktune::cpu
