// Linear: the base projection through kernels/cpu/linear plus the adapter hook. See linear.h.
#include "model/linear.h"

#include <cstring>

#include "core/error.h"
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

void add_to_gradient(const Tensor& grad, int64_t begin, const float* g, int64_t n) {
  if (grad.dtype() == DType::F32) {
    float* dst = grad.f32() + begin;
    parallel_for(n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) dst[i] += g[i];
    }, 1 << 15);
    return;
  }
  bf16_t* dst = grad.bf16() + begin;
  parallel_for(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) dst[i] = f32_to_bf16(bf16_to_f32(dst[i]) + g[i]);
  }, 1 << 15);
}

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
    const bool w_grad = weight->trainable, b_grad = bias && bias->trainable;
    const bool narrow = (w_grad && weight->grad.dtype() != DType::F32) || (b_grad && bias->grad.dtype() != DType::F32);
    if (!narrow) {
      float* dw = w_grad ? weight->grad.f32() : nullptr;
      float* db = b_grad ? bias->grad.f32() : nullptr;
      if (dx || dw || db)
        cpu::linear_backward(dx, dw, db, dy, x, dx ? weight_f32(weight_scratch) : nullptr, N, in, out, accumulate_dx);
    } else {
      // bf16 gradients (only a bf16 weight has them, so weight_scratch holds out*in + out floats):
      // this call's dW, db in f32, added into the stored gradients; then W widened for dx.
      check(weight_scratch != nullptr, name, "a bf16 gradient needs the weight scratch");
      float* dw = w_grad ? weight_scratch : nullptr;
      float* db = b_grad ? weight_scratch + out * in : nullptr;
      if (dw) std::memset(dw, 0, sizeof(float) * size_t(out * in));
      if (db) std::memset(db, 0, sizeof(float) * size_t(out));
      cpu::linear_backward(nullptr, dw, db, dy, x, nullptr, N, in, out, false);
      if (dw) add_to_gradient(weight->grad, 0, dw, out * in);
      if (db) add_to_gradient(bias->grad, 0, db, out);
      if (dx) cpu::linear_backward(dx, nullptr, nullptr, dy, x, weight_f32(weight_scratch), N, in, out, accumulate_dx);
    }
  }
  if (adapter) adapter->backward(dx, dy, x, N, *this, saved, scratch);
}

}  // namespace ktune::model
