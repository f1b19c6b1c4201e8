// NF4 quantisation on the host (see nf4_host.h): cpu::nf4_quantize / nf4_dequantize line for line,
// without the threads. Host code only; .cu because this directory's sources are .cu (decoder's
// CMakeLists: the model layer's *.cpp glob must not pick it into the CPU library).
#include "model/cuda/nf4_host.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <string>

#include "core/error.h"

namespace ktune::cuda {

const float kNf4CodeValues[16] = {-1.0f,
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

// Index of the nearest code to v in [-1, 1]: the count of midpoints below v (bitsandbytes' dQuantizeNF4).
uint8_t nearest_code(float v) {
  static const auto midpoints = [] {
    std::array<float, 15> m{};
    for (int i = 0; i < 15; ++i) m[size_t(i)] = 0.5f * (kNf4CodeValues[i] + kNf4CodeValues[i + 1]);
    return m;
  }();
  uint8_t code = 0;
  for (int i = 0; i < 15; ++i) code += uint8_t(v > midpoints[size_t(i)]);
  return code;
}

void check_blocks(int64_t n) {
  check(n % kNf4BlockSize == 0, "nf4",
        "tensor of " + std::to_string(n) + " elements is not a whole number of 64-blocks");
}

}  // namespace

void nf4_quantize_on_host(uint8_t* codes, float* scales, const float* x, int64_t n) {
  check_blocks(n);
  for (int64_t b = 0; b < n / kNf4BlockSize; ++b) {
    const float* xb = x + b * kNf4BlockSize;
    float absmax = 0.0f;
    for (int64_t i = 0; i < kNf4BlockSize; ++i) absmax = std::max(absmax, std::fabs(xb[i]));
    scales[b] = absmax;
    const float inv = absmax > 0.0f ? 1.0f / absmax : 0.0f;
    uint8_t* cb = codes + b * kNf4BlockSize / 2;
    for (int64_t i = 0; i < kNf4BlockSize; i += 2)
      cb[i / 2] = uint8_t(nearest_code(xb[i] * inv) << 4 | nearest_code(xb[i + 1] * inv));
  }
}

void nf4_dequantize_on_host(float* x, const uint8_t* codes, const float* scales, int64_t n) {
  check_blocks(n);
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t byte = codes[i >> 1];
    const uint8_t code = (i & 1) ? (byte & 0x0f) : (byte >> 4);
    x[i] = kNf4CodeValues[code] * scales[i / kNf4BlockSize];
  }
}

}  // namespace ktune::cuda
