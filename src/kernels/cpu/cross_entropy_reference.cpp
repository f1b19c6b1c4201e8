// The plain fused-loss reference: every (N, V) logit in double, then the same sums and gradients.
#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/cross_entropy.h"

namespace ktune::cpu {

double linear_cross_entropy_reference(float* dhidden, float* dweight, int64_t* n_valid, const float* hidden,
                                      const float* weight, const int32_t* labels, int64_t N, int64_t C, int64_t V,
                                      float softcap, float grad_scale) {
  double total = 0;
  int64_t count = 0;
  std::vector<double> z(static_cast<size_t>(V)), t(static_cast<size_t>(V));
  if (dhidden)
    for (int64_t i = 0; i < N * C; ++i) dhidden[i] = 0.0f;
  for (int64_t r = 0; r < N; ++r) {
    if (labels[r] == kIgnoreIndex) continue;
    if (labels[r] < 0 || labels[r] >= V)
      throw Error("cross_entropy: token " + std::to_string(r), "label " + std::to_string(labels[r]) + " outside [0, " +
                                                                  std::to_string(V) + ") and not -100");
    ++count;
    double m = -INFINITY;
    for (int64_t c = 0; c < V; ++c) {
      double acc = 0;
      for (int64_t i = 0; i < C; ++i) acc += double(hidden[r * C + i]) * weight[c * C + i];
      if (softcap > 0) {
        t[size_t(c)] = std::tanh(acc / softcap);
        acc = softcap * t[size_t(c)];
      }
      z[size_t(c)] = acc;
      m = std::max(m, acc);
    }
    double sum = 0;
    for (int64_t c = 0; c < V; ++c) sum += std::exp(z[size_t(c)] - m);
    double lse = m + std::log(sum);
    total += lse - z[size_t(labels[r])];
    for (int64_t c = 0; c < V; ++c) {
      double g = std::exp(z[size_t(c)] - lse) - (c == labels[r] ? 1.0 : 0.0);
      if (softcap > 0) g *= 1.0 - t[size_t(c)] * t[size_t(c)];
      g *= grad_scale;
      for (int64_t i = 0; i < C; ++i) {
        if (dhidden) dhidden[r * C + i] += float(g * weight[c * C + i]);
        if (dweight) dweight[c * C + i] += float(g * hidden[r * C + i]);
      }
    }
  }
  if (n_valid) *n_valid = count;
  return total;
}

}  // namespace ktune::cpu
