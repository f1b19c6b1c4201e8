// Linear: the base projection through kernels/cpu/linear plus the adapter hook. See linear.h.
#include "model/linear.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/parallel.h"
#include "kernels/cpu/bf16_rounding.h"
#include "kernels/cpu/gemm.h"
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

DType stored_dtype_of(const Parameter& p) { return p.stored_dtype ? *p.stored_dtype : p.value.dtype(); }

bool value_in_other_dtype(const Parameter& p) {
  return p.stored_dtype && p.value.defined() && p.value.dtype() != *p.stored_dtype;
}

Tensor stored_value(const Parameter& p) { return value_in_other_dtype(p) ? p.value.to(*p.stored_dtype) : p.value; }

void read_stored_f32(const Parameter& p, int64_t first, int64_t count, float* out) {
  const Tensor& v = p.value;
  check(v.defined(), p.name, "its value was released: nothing to read");
  check(first >= 0 && count >= 0 && first + count <= v.numel(), p.name,
        "elements [" + std::to_string(first) + ", " + std::to_string(first + count) + ") of " +
            std::to_string(v.numel()));
  const DType stored = stored_dtype_of(p);
  check((v.dtype() == DType::F32 || v.dtype() == DType::BF16 || v.dtype() == DType::F16) &&
            (stored == DType::F32 || stored == DType::BF16),
        p.name, std::string("a value read as f32 is held f32, bf16 or f16 and stored f32 or bf16, not held ") +
                    dtype_name(v.dtype()) + " stored " + dtype_name(stored));
  if (v.dtype() == DType::BF16) {  // bf16 widens exactly (stored f32 or bf16 alike)
    const bf16_t* src = v.bf16() + first;
    for (int64_t i = 0; i < count; ++i) out[i] = bf16_to_f32(src[i]);
    return;
  }
  if (v.dtype() == DType::F16) {  // f16 widens exactly; stored bf16, that rounds once, as a copy's f16 -> bf16 does
    const uint16_t* src = v.data<uint16_t>() + first;
    if (stored == DType::F32)
      for (int64_t i = 0; i < count; ++i) out[i] = f16_to_f32(src[i]);
    else
      for (int64_t i = 0; i < count; ++i) out[i] = bf16_to_f32(f32_to_bf16(f16_to_f32(src[i])));
    return;
  }
  const float* src = v.f32() + first;
  if (stored == DType::F32) {
    std::memcpy(out, src, size_t(count) * sizeof(float));
    return;
  }
  for (int64_t i = 0; i < count; ++i) out[i] = bf16_to_f32(f32_to_bf16(src[i]));  // f32 held, bf16 stored
}

void add_to_gradient(const Tensor& grad, int64_t begin, const float* g, int64_t n) {
  if (grad.dtype() == DType::F32) {
    float* dst = grad.f32() + begin;
    parallel_for(n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) dst[i] += g[i];
    }, 1 << 15);
    return;
  }
  cpu::add_rounded_to_bf16(grad.bf16() + begin, g, n);
}

bool Linear::multiplies_bf16() const {
  return weight->value.defined() && weight->value.dtype() == DType::BF16 && cpu::bf16_weights_use_bf16_gemm();
}

int64_t Linear::weight_scratch_floats(int64_t N, DType storage) const {
  if (storage == DType::F32) return 0;
  if (!cpu::bf16_weights_use_bf16_gemm()) return out * in + out;
  return cpu::bf16_floats(N * in) + cpu::bf16_floats(N * out) + cpu::weight_gradient_block_rows(out, in) * in + out;
}

const float* Linear::weight_f32(float* weight_scratch) const { return widen(weight->value, weight_scratch); }

const float* Linear::bias_f32(float* weight_scratch) const {
  return bias ? widen(bias->value, weight_scratch + out * in) : nullptr;
}

void Linear::forward(float* y, const float* x, int64_t N, float* saved, float* weight_scratch) const {
  if (!(adapter && adapter->replaces_base())) {
    const bool bf16_value = weight->value.defined() && weight->value.dtype() == DType::BF16 &&
                            (!bias || bias->value.dtype() == DType::BF16);
    if (multiplies_bf16())
      forward_bf16(y, x, N, weight_scratch);
    else if (bf16_value && N <= cpu::kWideningRowsMax)  // decoding: W widened a row at a time as it is read
      cpu::linear_forward_widening_bf16(y, x, weight->value.bf16(), bias ? bias->value.bf16() : nullptr, N, in, out);
    else
      cpu::linear_forward(y, x, weight_f32(weight_scratch), bias_f32(weight_scratch), N, in, out);
  }
  if (adapter) adapter->forward(y, x, N, *this, saved);
}

void Linear::backward(float* dx, const float* dy, const float* x, int64_t N, const float* saved, float* scratch,
                      float* weight_scratch, bool accumulate_dx) const {
  if (adapter && adapter->replaces_base()) {
    if (dx && !accumulate_dx) std::memset(dx, 0, sizeof(float) * size_t(N * in));
  } else if (multiplies_bf16()) {
    backward_bf16(dx, dy, x, N, weight_scratch, accumulate_dx);
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

// weight_scratch as bf16 GEMMs use it:  x16 (N, in) bf16 | dy16 (N, out) bf16 | dW rows (block, in) | db (out)

void Linear::forward_bf16(float* y, const float* x, int64_t N, float* weight_scratch) const {
  check(weight_scratch != nullptr, name, "bf16 GEMMs need the weight scratch (x rounded to bf16)");
  check(!bias || bias->value.dtype() == DType::BF16, name, "a bf16 weight with a bias that is not bf16");
  bf16_t* x16 = cpu::as_bf16(weight_scratch);
  cpu::round_to_bf16(x16, x, N * in);
  cpu::linear_forward_bf16(y, x16, weight->value.bf16(), bias ? bias->value.bf16() : nullptr, N, in, out);
}

void Linear::backward_bf16(float* dx, const float* dy, const float* x, int64_t N, float* weight_scratch,
                           bool accumulate_dx) const {
  const bool w_grad = weight->trainable, b_grad = bias && bias->trainable;
  if (!dx && !w_grad && !b_grad) return;
  check(weight_scratch != nullptr, name, "bf16 GEMMs need the weight scratch (x, dy rounded to bf16)");
  bf16_t* x16 = cpu::as_bf16(weight_scratch);
  bf16_t* dy16 = cpu::as_bf16(weight_scratch + cpu::bf16_floats(N * in));
  float* block = weight_scratch + cpu::bf16_floats(N * in) + cpu::bf16_floats(N * out);  // (rows, in)
  float* db = block + cpu::weight_gradient_block_rows(out, in) * in;  // (out)
  if (dx || w_grad) cpu::round_to_bf16(dy16, dy, N * out);
  if (dx) cpu::linear_backward_input_bf16(dx, dy16, weight->value.bf16(), N, in, out, accumulate_dx);
  if (w_grad) {
    cpu::round_to_bf16(x16, x, N * in);
    if (weight->grad.dtype() == DType::F32) {  // (sharded data parallelism's f32 flat) accumulate in place
      cpu::linear_backward_weight_bf16(weight->grad.f32(), dy16, x16, N, in, out, 0, out, 1.0f);
    } else {
      cpu::linear_backward_weight_bf16_blocks(weight->grad.bf16(), dy16, x16, N, in, out, block);
    }
  }
  if (b_grad) {  // from the f32 dy: a column sum needs no GEMM operands
    const bool narrow = bias->grad.dtype() != DType::F32;
    float* dst = narrow ? db : bias->grad.f32();
    if (narrow) std::memset(db, 0, sizeof(float) * size_t(out));
    cpu::linear_backward(nullptr, nullptr, dst, dy, nullptr, nullptr, N, in, out, false);
    if (narrow) add_to_gradient(bias->grad, 0, db, out);
  }
}

}  // namespace ktune::model
