// Linear on a bf16 weight multiplied as bf16 (KTUNE_BF16_GEMM=bf16, so it runs on any CPU): forward
// and backward against the f32 reference on the bf16-rounded operands (x and dy rounded to bf16 as
// the projection does), dW of several row blocks added into a bf16 gradient with one rounding per
// block, the f32 gradient a sharded reduction points at, a frozen weight, and LoRA on a frozen bf16
// base against the widened path.
#include "model/linear.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/linear.h"
#include "model/adapters/lora_adapter.h"
#include "scoped_bf16_gemm.h"

using namespace ktune;
using namespace ktune::model;
using ktune::testing::ScopedBf16Gemm;

namespace {

std::vector<float> random_floats(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

std::vector<float> rounded(const std::vector<float>& x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = bf16_to_f32(f32_to_bf16(x[i]));
  return out;
}

std::vector<float> to_floats(const Tensor& t) {
  Tensor f = t.to(DType::F32);
  return std::vector<float>(f.f32(), f.f32() + f.numel());
}

// max |a - b| / max |b|
double rel_error(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, double(std::fabs(a[i] - b[i])));
    scale = std::max(scale, double(std::fabs(b[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

// A bf16 projection (out, in) with a bias, both trainable, their gradients bf16 holding g0 values.
struct Bf16Projection {
  int64_t in, out;
  Parameter weight, bias;
  Linear linear;
  std::vector<float> w, b, g0_w, g0_b;  // the bf16 values widened

  Bf16Projection(int64_t in_, int64_t out_, DType grad_dtype) : in(in_), out(out_) {
    w = rounded(random_floats(size_t(out * in), 1, 0.05f));
    b = rounded(random_floats(size_t(out), 2, 0.5f));
    g0_w = rounded(random_floats(size_t(out * in), 3, 0.01f));
    g0_b = rounded(random_floats(size_t(out), 4, 0.01f));
    weight.name = "proj.weight";
    weight.value = from(w, {out, in}).to(DType::BF16);
    weight.grad = from(g0_w, {out, in}).to(grad_dtype);
    bias.name = "proj.bias";
    bias.value = from(b, {out}).to(DType::BF16);
    bias.grad = from(g0_b, {out}).to(grad_dtype);
    linear.name = "proj";
    linear.weight = &weight;
    linear.bias = &bias;
    linear.in = in;
    linear.out = out;
  }
  static Tensor from(const std::vector<float>& v, Shape shape) {
    Tensor t = Tensor::empty(std::move(shape));
    std::copy(v.begin(), v.end(), t.f32());
    return t;
  }
};

}  // namespace

TEST(LinearBf16Gemm, ForwardAndBackwardMatchTheF32ReferenceOnBf16RoundedOperands) {
  ScopedBf16Gemm native("bf16");
  // out * in above cpu::kWeightGradientBlockFloats: dW in three blocks of rows (the last partial).
  const int64_t N = 6, in = 2048, out = 1100;
  for (DType grad_dtype : {DType::BF16, DType::F32}) {
    const std::string tag = grad_dtype == DType::BF16 ? " (bf16 gradients)" : " (f32 gradients)";
    Bf16Projection p(in, out, grad_dtype);
    ASSERT_TRUE(p.linear.multiplies_bf16());
    ASSERT_GT(out * in, 2 * cpu::kWeightGradientBlockFloats);
    std::vector<float> scratch(size_t(p.linear.weight_scratch_floats(N, DType::BF16)));
    const auto x = random_floats(size_t(N * in), 5, 1.0f), dy = random_floats(size_t(N * out), 6, 1.0f);
    std::vector<float> y(size_t(N * out)), y_ref(y.size());
    p.linear.forward(y.data(), x.data(), N, nullptr, scratch.data());
    cpu::linear_forward_reference(y_ref.data(), rounded(x).data(), p.w.data(), p.b.data(), N, in, out);
    EXPECT_LE(rel_error(y, y_ref), 1e-5) << "y" << tag;

    std::vector<float> dx = random_floats(size_t(N * in), 7, 1.0f), dx_ref = dx;
    std::vector<float> dw_ref(size_t(out * in), 0.0f), db_ref(size_t(out), 0.0f);
    p.linear.backward(dx.data(), dy.data(), x.data(), N, nullptr, nullptr, scratch.data(), /*accumulate_dx*/ true);
    cpu::linear_backward_reference(dx_ref.data(), dw_ref.data(), nullptr, rounded(dy).data(), rounded(x).data(),
                                   p.w.data(), N, in, out, true);
    cpu::linear_backward_reference(nullptr, nullptr, db_ref.data(), dy.data(), nullptr, nullptr, N, in, out, false);
    EXPECT_LE(rel_error(dx, dx_ref), 1e-5) << "dx" << tag;
    // g0 + this call's dW (db from the unrounded dy), rounded once when the gradient is bf16. The f32
    // sums differ in accumulation order only (1e-5 of the largest): once rounded, at most an ulp (<= 2^-7 relative) apart.
    const bool bf16_grad = grad_dtype == DType::BF16;
    auto worst_ratio = [&](const std::vector<float>& got, const std::vector<float>& g0, const std::vector<float>& d) {
      double scale = 0, worst = 0;
      for (size_t i = 0; i < got.size(); ++i) scale = std::max(scale, std::fabs(double(g0[i]) + d[i]));
      for (size_t i = 0; i < got.size(); ++i) {
        const float sum = g0[i] + d[i];
        const double expected = bf16_grad ? bf16_to_f32(f32_to_bf16(sum)) : sum;
        const double allowed = (bf16_grad ? std::ldexp(std::fabs(sum), -7) : 0.0) + 1e-5 * scale;
        worst = std::max(worst, std::fabs(got[i] - expected) / allowed);
      }
      return worst;
    };
    EXPECT_LE(worst_ratio(to_floats(p.weight.grad), p.g0_w, dw_ref), 1.0) << "dW" << tag;
    EXPECT_LE(worst_ratio(to_floats(p.bias.grad), p.g0_b, db_ref), 1.0) << "db" << tag;
  }
}

TEST(LinearBf16Gemm, AFrozenWeightGetsNoGradientAndStillPassesDx) {
  ScopedBf16Gemm native("bf16");
  const int64_t N = 9, in = 48, out = 40;
  Bf16Projection p(in, out, DType::BF16);
  p.weight.trainable = p.bias.trainable = false;
  const Tensor before_w = p.weight.grad.clone(), before_b = p.bias.grad.clone();
  std::vector<float> scratch(size_t(p.linear.weight_scratch_floats(N, DType::BF16)));
  const auto x = random_floats(size_t(N * in), 5, 1.0f), dy = random_floats(size_t(N * out), 6, 1.0f);
  std::vector<float> dx(size_t(N * in), NAN), dx_ref(dx.size());
  p.linear.backward(dx.data(), dy.data(), x.data(), N, nullptr, nullptr, scratch.data(), false);
  cpu::linear_backward_reference(dx_ref.data(), nullptr, nullptr, rounded(dy).data(), nullptr, p.w.data(), N, in, out,
                                 false);
  EXPECT_LE(rel_error(dx, dx_ref), 1e-5);
  EXPECT_EQ(to_floats(p.weight.grad), to_floats(before_w));
  EXPECT_EQ(to_floats(p.bias.grad), to_floats(before_b));
}

TEST(LinearBf16Gemm, LoraOnAFrozenBf16BaseTracksTheWidenedBase) {
  const int64_t N = 12, in = 64, out = 48;
  const auto x = random_floats(size_t(N * in), 5, 1.0f), dy = random_floats(size_t(N * out), 6, 1.0f);
  std::vector<std::vector<float>> y(2), dx(2), da(2), dbb(2);
  for (int native = 0; native < 2; ++native) {
    ScopedBf16Gemm mode(native ? "bf16" : "widen");
    Bf16Projection p(in, out, DType::BF16);
    p.weight.trainable = p.bias.trainable = false;
    LoraOptions options;
    options.rank = 4;
    auto adapter = std::make_shared<LoraAdapter>(p.linear, options);
    p.linear.adapter = adapter;
    std::vector<Parameter*> params = adapter->parameters();
    auto bvals = random_floats(size_t(out * options.rank), 8, 0.5f);  // B starts at zero: give it signal
    std::copy(bvals.begin(), bvals.end(), params[1]->value.f32());
    for (Parameter* q : params) q->grad = Tensor::zeros(q->value.shape());
    EXPECT_EQ(p.linear.multiplies_bf16(), native == 1);
    std::vector<float> scratch(size_t(std::max<int64_t>(1, p.linear.weight_scratch_floats(N, DType::BF16))));
    std::vector<float> saved(size_t(std::max<int64_t>(1, p.linear.saved_floats(N))));
    std::vector<float> adapter_scratch(size_t(std::max<int64_t>(1, p.linear.scratch_floats(N))));
    y[size_t(native)].resize(size_t(N * out));
    dx[size_t(native)].resize(size_t(N * in));
    p.linear.forward(y[size_t(native)].data(), x.data(), N, saved.data(), scratch.data());
    p.linear.backward(dx[size_t(native)].data(), dy.data(), x.data(), N, saved.data(), adapter_scratch.data(),
                      scratch.data(), false);
    da[size_t(native)] = to_floats(params[0]->grad);
    dbb[size_t(native)] = to_floats(params[1]->grad);
  }
  // Rounding x and dy to bf16 for the base's GEMMs: 2^-9 relative per operand; the adapter's own
  // (f32) GEMMs see the same f32 x and dy either way, so its gradients agree to f32 accuracy.
  EXPECT_GT(rel_error(y[1], y[0]), 0.0) << "the bf16 path ran";
  EXPECT_LE(rel_error(y[1], y[0]), 1e-2);
  EXPECT_LE(rel_error(dx[1], dx[0]), 1e-2);
  EXPECT_LE(rel_error(da[1], da[0]), 1e-6);
  EXPECT_LE(rel_error(dbb[1], dbb[0]), 1e-6);
}
