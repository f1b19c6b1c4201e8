// Host emulation of cuda_bf16.h's __nv_bfloat16: the 16 bits and the two conversions ktune's kernels
// use (widening is exact; narrowing rounds to nearest even, NaN stays a quiet NaN), which are the
// device's bit for bit and so core/dtype.h's bf16_to_f32 / f32_to_bf16, used here. It deliberately
// has no bf16 arithmetic operators: the kernels widen to f32 first, and a kernel that did not would
// fail to compile here.
#pragma once
#include <cstdint>

#include "core/dtype.h"

struct __nv_bfloat16 {
  uint16_t bits;
};
inline float __bfloat162float(__nv_bfloat16 h) { return ktune::bf16_to_f32(h.bits); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16{ktune::f32_to_bf16(f)}; }
