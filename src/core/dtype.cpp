#include "core/dtype.h"

#include "core/error.h"

namespace ktune {

size_t dtype_bytes(DType dtype, size_t n) {
  switch (dtype) {
    case DType::F32: return 4 * n;
    case DType::BF16: return 2 * n;
    case DType::F16: return 2 * n;
    case DType::NF4: return (n + 1) / 2;
    case DType::I32: return 4 * n;
    case DType::I64: return 8 * n;
    case DType::U8: return n;
  }
  throw Error("dtype", "unknown dtype");
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32: return "f32";
    case DType::BF16: return "bf16";
    case DType::F16: return "f16";
    case DType::NF4: return "nf4";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::U8: return "u8";
  }
  return "?";
}

DType dtype_from_name(const std::string& name) {
  if (name == "f32" || name == "fp32" || name == "float32" || name == "F32") return DType::F32;
  if (name == "bf16" || name == "bfloat16" || name == "BF16") return DType::BF16;
  if (name == "f16" || name == "fp16" || name == "float16" || name == "F16") return DType::F16;
  if (name == "nf4") return DType::NF4;
  if (name == "i32" || name == "int32" || name == "I32") return DType::I32;
  if (name == "i64" || name == "int64" || name == "I64") return DType::I64;
  if (name == "u8" || name == "uint8" || name == "U8") return DType::U8;
  throw Error("dtype", "unknown dtype '" + name + "' (expected f32, bf16, f16, nf4, i32, i64 or u8)");
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int shift = 0;
      while ((mantissa & 0x400u) == 0) { mantissa <<= 1; ++shift; }
      mantissa &= 0x3ffu;
      bits = sign | uint32_t(127 - 15 - shift + 1) << 23 | mantissa << 13;
    }
  } else if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | mantissa << 13;
  } else {
    bits = sign | (exponent + 127 - 15) << 23 | mantissa << 13;
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  const uint16_t sign = uint16_t((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return uint16_t(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));  // NaN, quiet
  if (magnitude >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // 65520 and up (and infinity): infinity
  if (magnitude >= 0x38800000u) {  // 2^-14 and up: a normal half; the bias rounds to nearest even
    const uint32_t rounded = magnitude + 0xfffu + ((magnitude >> 13) & 1u);
    return uint16_t(sign | ((rounded >> 13) - ((127u - 15u) << 10)));
  }
  if (magnitude < 0x33000000u) return sign;  // below 2^-25, half the smallest subnormal: zero
  // A subnormal half counts units of 2^-24: the f32's significand (value = significand * 2^(e - 150))
  // shifted right by 126 - e (14 to 24), rounded to nearest even; 0x400 is the smallest normal.
  const uint32_t exponent = magnitude >> 23, significand = (magnitude & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - exponent;
  uint32_t units = significand >> shift;
  const uint32_t dropped = significand & ((1u << shift) - 1u), half_unit = 1u << (shift - 1u);
  if (dropped > half_unit || (dropped == half_unit && (units & 1u))) ++units;
  return uint16_t(sign | units);
}

}  // namespace ktune
