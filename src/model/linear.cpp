// Linear: the base projection through kernels/cpu/linear plus the adapter hook. See linear.h.
#include "model/linear.h"

#include <cstring>

#include "kernels/cpu/linear.h"

namespace ktune::model {

void Linear::forward(float* y, const float* x, int64_t N, float* saved) const {
  if (!(adapter && adapter->replaces_base()))
    cpu::linear_forward(y, x, weight->value.f32(), bias ? bias->value.f32() : nullptr, N, in, out);
  if (adapter) adapter->forward(y, x, N, *this, saved);
}

void Linear::backward(float* dx, const float* dy, const float* x, int64_t N, const float* saved, float* scratch,
                      bool accumulate_dx) const {
  if (adapter && adapter->replaces_base()) {
    if (dx && !accumulate_dx) std::memset(dx, 0, sizeof(float) * size_t(N * in));
  } else {
    float* dw = weight->trainable ? weight->grad.f32() : nullptr;
    float* db = bias && bias->trainable ? bias->grad.f32() : nullptr;
    if (dx || dw || db) cpu::linear_backward(dx, dw, db, dy, x, weight->value.f32(), N, in, out, accumulate_dx);
  }
  if (adapter) adapter->backward(dx, dy, x, N, *this, saved, scratch);
}

}  // namespace ktune::model
