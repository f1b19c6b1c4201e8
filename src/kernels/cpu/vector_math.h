// exp and tanh in a form the compiler vectorises inside `#pragma omp simd` loops (glibc's vector
// libm is used only under -ffast-math, which would also break the -inf masking attention relies on).
// Cephes' single-precision polynomials: exp within ~2 ulp, tanh within ~3e-7 absolute.
// Internal to the kernels; it deliberately offers nothing beyond what they use.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace ktune::cpu {

// exp(x); 0 below -87.33 (and for -inf), 2^127-ish above 88.37 (callers subtract a max first).

inline float vexp(float x) {
  constexpr float kHi = 88.3762626647949f, kLo = -87.3365447504f;
  float xc = x > kHi ? kHi : x;
  xc = xc < kLo ? kLo : xc;
  // round(x / ln2) by the 1.5 * 2^23 trick (vectorises; std::floor does not without -ffast-math)
  constexpr float kMagic = 12582912.0f;
  float shifted = xc * 1.44269504088896341f + kMagic;
  float n = shifted - kMagic;
  float r = xc - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float y = p * r * r + r + 1.0f;
  float scale = std::bit_cast<float>((std::bit_cast<int32_t>(shifted) - std::bit_cast<int32_t>(kMagic) + 127) << 23);
  return x < kLo ? 0.0f : y * scale;
}

// tanh(x): an odd polynomial near 0, 1 - 2 / (exp(2|x|) + 1) elsewhere.

inline float vtanh(float x) {
  float ax = std::fabs(x);
  float z = x * x;
  float small = ((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z + 1.33314422036e-1f) * z -
                 3.33332819422e-1f) * z * x + x;
  float e = vexp(ax > 44.0f ? 88.0f : 2.0f * ax);
  float large = 1.0f - 2.0f / (e + 1.0f);
  large = x < 0.0f ? -large : large;
  return ax < 0.625f ? small : large;
}

}  // namespace ktune::cpu
