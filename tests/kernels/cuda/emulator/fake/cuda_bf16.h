// Host emulation of cuda_bf16.h's __nv_bfloat16: the 16 bits and the two conversions ktune's kernels
// use (widening is exact; narrowing rounds to nearest even, NaN stays a quiet NaN), bit for bit as
// the device and core/dtype.h's f32_to_bf16 do. It deliberately has no bf16 arithmetic operators:
// the kernels widen to f32 first, and a kernel that did not would fail to compile here.
#pragma once
#include <cstdint>
#include <cstring>

struct __nv_bfloat16 {
  uint16_t bits;
};
inline float __bfloat162float(__nv_bfloat16 h) {
  uint32_t b = uint32_t(h.bits) << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  if ((b & 0x7fffffffu) > 0x7f800000u) return __nv_bfloat16{uint16_t((b >> 16) | 0x40u)};
  return __nv_bfloat16{uint16_t((b + 0x7fffu + ((b >> 16) & 1u)) >> 16)};
}
