// Test support for the bf16 kernel tests: f32 values rounded to bf16 (to nearest even) and bf16
// values widened back, so that an f32 reference can run on exactly the bf16 operands.
#pragma once

#include <vector>

#include "core/dtype.h"

namespace ktune::cpu::testing {

inline std::vector<bf16_t> to_bf16(const std::vector<float>& x) {
  std::vector<bf16_t> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = f32_to_bf16(x[i]);
  return out;
}

inline std::vector<float> widened(const std::vector<bf16_t>& x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = bf16_to_f32(x[i]);
  return out;
}

}  // namespace ktune::cpu::testing
