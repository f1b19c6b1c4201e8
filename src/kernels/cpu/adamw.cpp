// AdamW in the order torch.optim.AdamW's single-tensor path computes it (scalars in double, as Python):
//   param *= 1 - lr*wd;  m = lerp(m, g, 1-beta1);  v = beta2 v + (1-beta2) g^2
//   param -= lr/(1-beta1^t) * m / (sqrt(v)/sqrt(1-beta2^t) + eps)
// The bf16 path does the arithmetic in f32 and rounds param, m, v stochastically with random bits
// hashed from (seed, index, which-tensor): the same seed gives the same result on any thread count.
#include "kernels/cpu/adamw.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "core/random_bits.h"

namespace ktune::cpu {
namespace {

constexpr int64_t kGrain = 16384;  // elements a thread must have before a split pays

}  // namespace

void adamw_step(float* param, const float* grad, float* m, float* v, int64_t n, const AdamWStep& s) {
  const AdamWCoefficients c = adamw_coefficients(s);
  parallel_for(n, [&](int64_t i0, int64_t i1) {
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i) {
      float g = grad[i];
      float p = param[i] * c.decay;
      float mi = m[i] + (g - m[i]) * c.one_minus_b1;
      float vi = v[i] * c.b2 + c.one_minus_b2 * g * g;
      float denom = std::sqrt(vi) * c.inv_bc2_sqrt + c.eps;
      param[i] = p - c.step_size * mi / denom;
      m[i] = mi;
      v[i] = vi;
    }
  }, kGrain);
}

void adamw_step_bf16(bf16_t* param, const float* grad, bf16_t* m, bf16_t* v, int64_t n, const AdamWStep& s,
                     uint64_t seed) {
  const AdamWCoefficients c = adamw_coefficients(s);
  const uint64_t key = splitmix64(seed);
  parallel_for(n, [&](int64_t i0, int64_t i1) {
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i) {
      float g = grad[i];
      float mf = bf16_to_f32(m[i]), vf = bf16_to_f32(v[i]);
      float p = bf16_to_f32(param[i]) * c.decay;
      mf = mf + (g - mf) * c.one_minus_b1;
      vf = vf * c.b2 + c.one_minus_b2 * g * g;
      p -= c.step_size * mf / (std::sqrt(vf) * c.inv_bc2_sqrt + c.eps);
      uint64_t bits = splitmix64(key ^ uint64_t(i));  // 48 bits used: 16 for each tensor
      param[i] = f32_to_bf16_stochastic(p, uint32_t(bits));
      m[i] = f32_to_bf16_stochastic(mf, uint32_t(bits >> 16));
      v[i] = f32_to_bf16_stochastic(vf, uint32_t(bits >> 32));
    }
  }, kGrain);
}

double sum_of_squares(const float* x, int64_t n) {
  int threads = num_threads();
  std::vector<double> partial(size_t(threads), 0.0);
  parallel_for(n, [&](int64_t i0, int64_t i1) {
    double acc = 0.0;
    // f32 partial sums over short runs, accumulated in double: fast and accurate enough for a norm.
    for (int64_t b = i0; b < i1; b += 1024) {
      int64_t e = std::min(i1, b + 1024);
      float f = 0.0f;
#pragma omp simd reduction(+ : f)
      for (int64_t i = b; i < e; ++i) f += x[i] * x[i];
      acc += f;
    }
    partial[size_t(omp_get_thread_num())] = acc;
  }, kGrain);
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

void scale_inplace(float* x, int64_t n, float factor) {
  parallel_for(n, [&](int64_t i0, int64_t i1) {
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i) x[i] *= factor;
  }, kGrain * 4);
}

void adamw_step_reference(float* param, const float* grad, float* m, float* v, int64_t n, const AdamWStep& s) {
  double bc1 = 1.0 - std::pow(double(s.beta1), double(s.step));
  double bc2 = 1.0 - std::pow(double(s.beta2), double(s.step));
  for (int64_t i = 0; i < n; ++i) {
    double g = grad[i];
    double p = double(param[i]) * (1.0 - double(s.lr) * double(s.weight_decay));
    double mi = double(s.beta1) * m[i] + (1.0 - double(s.beta1)) * g;
    double vi = double(s.beta2) * v[i] + (1.0 - double(s.beta2)) * g * g;
    p -= double(s.lr) / bc1 * mi / (std::sqrt(vi) / std::sqrt(bc2) + double(s.eps));
    param[i] = float(p);
    m[i] = float(mi);
    v[i] = float(vi);
  }
}

}  // namespace ktune::cpu
