// AdamW exactly as torch.optim.AdamW (default, non-amsgrad) computes it: decoupled weight decay
// (param *= 1 - lr*wd), bias correction, eps outside the square root; step is 1-based.
// The bf16 variant keeps param, m and v in bf16 and rounds stochastically (counter-based random bits
// from seed and element index, so results do not depend on the thread count).
// Also the two reductions gradient clipping needs. It deliberately holds no optimizer state itself.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "core/error.h"

namespace ktune::cpu {

struct AdamWStep {
  float lr, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
  int64_t step;  // 1-based
};

// What every element's update uses, computed once a step in double and rounded to f32: the CPU and
// the GPU kernels (kernels/cuda/adamw.cu) both take them from here, so both engines step alike.
struct AdamWCoefficients {
  float decay;          // 1 - lr*wd
  float one_minus_b1;   // lerp weight
  float b2, one_minus_b2;
  float step_size;      // lr / bias_correction1
  float inv_bc2_sqrt;   // 1 / sqrt(bias_correction2)
  float eps;
};
inline AdamWCoefficients adamw_coefficients(const AdamWStep& s) {
  check(s.step >= 1, "adamw", "step is 1-based, got " + std::to_string(s.step));
  const double bc1 = 1.0 - std::pow(double(s.beta1), double(s.step));
  const double bc2 = 1.0 - std::pow(double(s.beta2), double(s.step));
  AdamWCoefficients c;
  c.decay = float(1.0 - double(s.lr) * double(s.weight_decay));
  c.one_minus_b1 = float(1.0 - double(s.beta1));
  c.b2 = s.beta2;
  c.one_minus_b2 = float(1.0 - double(s.beta2));
  c.step_size = float(double(s.lr) / bc1);
  c.inv_bc2_sqrt = float(1.0 / std::sqrt(bc2));
  c.eps = s.eps;
  return c;
}

// param, grad, m, v: (n)
void adamw_step(float* param, const float* grad, float* m, float* v, int64_t n, const AdamWStep& s);
void adamw_step_bf16(bf16_t* param, const float* grad, bf16_t* m, bf16_t* v, int64_t n, const AdamWStep& s,
                     uint64_t seed);
double sum_of_squares(const float* x, int64_t n);  // for grad-norm clipping (double accumulation)
void scale_inplace(float* x, int64_t n, float factor);

void adamw_step_reference(float* param, const float* grad, float* m, float* v, int64_t n, const AdamWStep& s);

}  // namespace ktune::cpu
