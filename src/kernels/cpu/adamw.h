// AdamW exactly as torch.optim.AdamW (default, non-amsgrad) computes it: decoupled weight decay
// (param *= 1 - lr*wd), bias correction, eps outside the square root; step is 1-based.
// The bf16 variant keeps param, m and v in bf16 and rounds stochastically (counter-based random bits
// from seed and element index, so results do not depend on the thread count).
// Also the two reductions gradient clipping needs. It deliberately holds no optimizer state itself.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace ktune::cpu {

struct AdamWStep {
  float lr, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
  int64_t step;  // 1-based
};

// param, grad, m, v: (n)
void adamw_step(float* param, const float* grad, float* m, float* v, int64_t n, const AdamWStep& s);
void adamw_step_bf16(bf16_t* param, const float* grad, bf16_t* m, bf16_t* v, int64_t n, const AdamWStep& s,
                     uint64_t seed);
double sum_of_squares(const float* x, int64_t n);  // for grad-norm clipping (double accumulation)
void scale_inplace(float* x, int64_t n, float factor);

void adamw_step_reference(float* param, const float* grad, float* m, float* v, int64_t n, const AdamWStep& s);

}  // namespace ktune::cpu
