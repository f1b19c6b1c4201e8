// Element types and the conversions between them.
// bf16 is the top half of an IEEE f32; narrowing rounds to nearest even (NaN stays NaN),
// or stochastically where a caller supplies random bits (pure-bf16 training keeps small updates).
// nf4 is QLoRA's 4-bit NormalFloat: two codes a byte, a scale per block (see kernels/cpu/nf4).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace ktune {

enum class DType : uint8_t { F32, BF16, F16, NF4, I32, I64, U8 };

// Bytes for n elements of dtype (nf4 packs two a byte, rounding up).
size_t dtype_bytes(DType dtype, size_t n);
const char* dtype_name(DType dtype);          // "f32", "bf16", ...
DType dtype_from_name(const std::string& name);  // accepts "f32"/"fp32"/"float32", "bf16"/"bfloat16", ...

using bf16_t = uint16_t;

inline float bf16_to_f32(bf16_t h) {
  uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Round to nearest, ties to even. NaN is kept a (quiet) NaN.
inline bf16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return bf16_t((bits >> 16) | 0x0040u);
  uint32_t rounding_bias = 0x7fffu + ((bits >> 16) & 1u);
  return bf16_t((bits + rounding_bias) >> 16);
}

// Stochastic rounding: round up with probability equal to the dropped fraction.
// random16: 16 uniformly random bits.
inline bf16_t f32_to_bf16_stochastic(float f, uint32_t random16) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7f800000u) == 0x7f800000u) return f32_to_bf16(f);  // inf, NaN
  return bf16_t((bits + (random16 & 0xffffu)) >> 16);
}

// IEEE half, for reading f16 checkpoints.
float f16_to_f32(uint16_t h);
// f32 to IEEE half: round to nearest, ties to even, through the subnormals; beyond the largest
// finite half (65504, from 65520 up) infinity; NaN stays a (quiet) NaN.
uint16_t f32_to_f16(float f);

}  // namespace ktune
