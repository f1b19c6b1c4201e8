// Linear: the base projection through kernels/cpu/linear plus the adapter hook. See linear.h.
#include "model/linear.h"

#include <cstring>

#include "core/parallel.h"
#include "kernels/cpu/linear.h"

namespace ktune::model {

namespace {

// f32 view of a parameter's value: the data itself, or (bf16) widened into dst.
const float* widen(const Tensor& value, float* dst) {
  if (value.dtype() == DType::F32) return value.f32();
  const bf16_t* src = value.bf16();
  parallel_for(value.numel(), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) dst[i] = bf16_to_f32(src[i]);
  }, 1 << 14);
  return dst;
}

}  // namespace

int64_t Linear::weight_scratch_floats() const {
  return weight->value.dtype() == DType::F32 ? 0 : out * in + out;
}

const float* Linear::weight_f32(float* weight_scratch) const { return widen(weight->value, weight_scratch); }

const float* Linear::bias_f32(float* weight_scratch) const {
  return bias ? widen(bias->value, weight_scratch + out * in) : nullptr;
}

void Linear::forward(float* y, const float* x, int64_t N, float* saved, float* weight_scratch) const {
  if (!(adapter && adapter->replaces_base()))
    cpu::linear_forward(y, x, weight_f32(weight_scratch), bias_f32(weight_scratch), N, in, out);
  if (adapter) adapter->forward(y, x, N, *this, saved);
}

void Linear::backward(float* dx, const float* dy, const float* x, int64_t N, const float* saved, float* scratch,
                      float* weight_scratch, bool accumulate_dx) const {
  if (adapter && adapter->replaces_base()) {
    if (dx && !accumulate_dx) std::memset(dx, 0, sizeof(float) * size_t(N * in));
  } else {
    float* dw = weight->trainable ? weight->grad.f32() : nullptr;
    float* db = bias && bias->trainable ? bias->grad.f32() : nullptr;
    if (dx || dw || db)
      cpu::linear_backward(dx, dw, db, dy, x, dx ? weight_f32(weight_scratch) : nullptr, N, in, out, accumulate_dx);
  }
  if (adapter) adapter->backward(dx, dy, x, N, *this, saved, scratch);
}

}  // namespace ktune::model
