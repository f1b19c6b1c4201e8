// The error measure of the model tests: max|a - b| / max|b| over a tensor (b the reference), so that
// one tolerance reads the same on logits, losses and gradients of any scale.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace ktune::testing {

inline double rel_error(const float* a, const float* b, int64_t n) {
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < n; ++i) {
    diff = std::max(diff, double(std::fabs(a[i] - b[i])));
    scale = std::max(scale, double(std::fabs(b[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

}  // namespace ktune::testing
