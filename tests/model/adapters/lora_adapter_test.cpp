// LoRA, DoRA and QLoRA on a lone Linear: forward against the formulas written out plainly, every
// gradient against central finite differences of a scalar loss L = Σ y ⊙ R.
#include "model/adapters/lora_adapter.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <tuple>

#include "core/error.h"
#include "kernels/cpu/nf4.h"

using namespace ktune;
using namespace ktune::model;

namespace {

struct Fixture {
  int64_t N = 5, in = 16, out = 8;
  Parameter weight, bias;
  Linear linear;
  std::vector<float> x, r;  // input (N, in), loss weights (N, out)

  explicit Fixture(bool with_bias = true, uint32_t seed = 1) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    weight.name = "model.layers.0.self_attn.q_proj.weight";
    weight.value = Tensor::empty({out, in});
    for (int64_t i = 0; i < out * in; ++i) weight.value.f32()[i] = 0.3f * normal(rng);
    weight.trainable = false;
    linear.name = "model.layers.0.self_attn.q_proj";
    linear.weight = &weight;
    linear.in = in;
    linear.out = out;
    if (with_bias) {
      bias.name = "model.layers.0.self_attn.q_proj.bias";
      bias.value = Tensor::empty({out});
      for (int64_t o = 0; o < out; ++o) bias.value.f32()[o] = normal(rng);
      bias.trainable = false;
      linear.bias = &bias;
    }
    x.resize(size_t(N * in));
    r.resize(size_t(N * out));
    for (float& v : x) v = normal(rng);
    for (float& v : r) v = normal(rng);
  }

  std::shared_ptr<LoraAdapter> attach(const LoraOptions& options) {
    auto adapter = std::make_shared<LoraAdapter>(linear, options);
    linear.adapter = adapter;
    // Non-zero B (it starts at zero) so that every path carries signal.
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 0.5f);
    for (Parameter* p : adapter->parameters()) {
      if (p->name.find("lora_B") != std::string::npos)
        for (int64_t i = 0; i < p->value.numel(); ++i) p->value.f32()[i] = normal(rng);
      p->grad = Tensor::zeros(p->value.shape());
      p->trainable = true;
    }
    return adapter;
  }

  std::vector<float> forward() {
    std::vector<float> y(size_t(N * out)), saved(size_t(std::max<int64_t>(1, linear.saved_floats(N))));
    linear.forward(y.data(), x.data(), N, saved.data(), nullptr);
    return y;
  }

  double loss() {
    std::vector<float> y = forward();
    double l = 0;
    for (size_t i = 0; i < y.size(); ++i) l += double(y[i]) * r[i];
    return l;
  }

  // Runs forward + backward; returns dx.
  std::vector<float> backward() {
    std::vector<float> y(size_t(N * out)), saved(size_t(std::max<int64_t>(1, linear.saved_floats(N))));
    std::vector<float> scratch(size_t(std::max<int64_t>(1, linear.scratch_floats(N)))), dx(size_t(N * in));
    linear.forward(y.data(), x.data(), N, saved.data(), nullptr);
    linear.backward(dx.data(), r.data(), x.data(), N, saved.data(), scratch.data(), nullptr, false);
    return dx;
  }
};

// Central differences of f with respect to each element of v, compared with analytic.
void expect_matches_finite_differences(const std::function<double()>& f, float* v, int64_t n, const float* analytic,
                                       const char* what) {
  for (int64_t i = 0; i < n; ++i) {
    const float saved = v[i];
    const float h = 1e-2f * std::max(1.0f, std::fabs(saved));
    v[i] = saved + h;
    double up = f();
    v[i] = saved - h;
    double down = f();
    v[i] = saved;
    double numeric = (up - down) / (2.0 * h);
    EXPECT_NEAR(analytic[i], numeric, 2e-3 * std::max(1.0, std::fabs(numeric))) << what << "[" << i << "]";
  }
}

}  // namespace

TEST(LoraAdapter, ForwardAddsScaledLowRankProduct) {
  Fixture f;
  auto adapter = f.attach({.rank = 4, .alpha = 8.0f});
  std::vector<float> y = f.forward();
  const float* A = adapter->parameters()[0]->value.f32();
  const float* B = adapter->parameters()[1]->value.f32();
  for (int64_t n = 0; n < f.N; ++n)
    for (int64_t o = 0; o < f.out; ++o) {
      double expected = f.bias.value.f32()[o];
      for (int64_t i = 0; i < f.in; ++i) expected += double(f.x[size_t(n * f.in + i)]) * f.weight.value.f32()[o * f.in + i];
      for (int64_t k = 0; k < 4; ++k) {
        double xa = 0;
        for (int64_t i = 0; i < f.in; ++i) xa += double(f.x[size_t(n * f.in + i)]) * A[k * f.in + i];
        expected += 2.0 * xa * B[o * 4 + k];
      }
      EXPECT_NEAR(y[size_t(n * f.out + o)], expected, 1e-4 * std::max(1.0, std::fabs(expected)));
    }
}

TEST(LoraAdapter, InitialisesAsPeft) {
  Fixture f;
  auto adapter = f.attach({.rank = 4, .alpha = 16.0f, .use_dora = true});
  auto params = adapter->parameters();
  EXPECT_EQ(params[0]->name, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
  EXPECT_EQ(params[1]->name, "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight");
  EXPECT_EQ(params[2]->name, "base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector");
  const float bound = 1.0f / std::sqrt(16.0f);
  for (int64_t i = 0; i < params[0]->value.numel(); ++i) EXPECT_LE(std::fabs(params[0]->value.f32()[i]), bound);
  for (int64_t o = 0; o < f.out; ++o) {
    double norm = 0;
    for (int64_t i = 0; i < f.in; ++i) norm += std::pow(f.weight.value.f32()[o * f.in + i], 2.0);
    EXPECT_NEAR(params[2]->value.f32()[o], std::sqrt(norm), 1e-5);
  }
  EXPECT_FLOAT_EQ(adapter->scale(), 4.0f);
}

TEST(LoraAdapter, GradientsMatchFiniteDifferences) {
  Fixture f;
  auto adapter = f.attach({.rank = 3, .alpha = 6.0f});
  std::vector<float> dx = f.backward();
  auto loss = [&] { return f.loss(); };
  for (Parameter* p : adapter->parameters())
    expect_matches_finite_differences(loss, p->value.f32(), p->value.numel(), p->grad.f32(), p->name.c_str());
  expect_matches_finite_differences(loss, f.x.data(), int64_t(f.x.size()), dx.data(), "dx");
}

TEST(LoraAdapter, DropoutGradientsMatchFiniteDifferencesForAFixedMask) {
  Fixture f;
  auto adapter = f.attach({.rank = 3, .alpha = 6.0f, .dropout = 0.3f, .seed = 11});
  adapter->set_dropout_key(42);
  std::vector<float> dx = f.backward();
  auto loss = [&] { return f.loss(); };
  for (Parameter* p : adapter->parameters())
    expect_matches_finite_differences(loss, p->value.f32(), p->value.numel(), p->grad.f32(), p->name.c_str());
  expect_matches_finite_differences(loss, f.x.data(), int64_t(f.x.size()), dx.data(), "dx");
}

TEST(LoraAdapter, DoraMagnitudeGradientMatchesFiniteDifferences) {
  Fixture f;
  auto adapter = f.attach({.rank = 2, .alpha = 4.0f, .use_dora = true});
  f.backward();
  Parameter* m = adapter->parameters()[2];
  expect_matches_finite_differences([&] { return f.loss(); }, m->value.f32(), m->value.numel(), m->grad.f32(), "dm");
}

TEST(LoraAdapter, DoraWithDropoutMagnitudeAndInputGradientsMatchFiniteDifferencesForAFixedMask) {
  // PEFT's DoRA with dropout: y = base(x) + (c − 1) ⊙ x' Wᵀ + c ⊙ s · x' Aᵀ Bᵀ, x' = dropout(x). The norm in
  // c does not depend on x or m, so these two gradients are plain derivatives of the loss (A and B: the
  // step parity with PEFT in tests/train/peft_steps checks them with the norm detached).
  for (bool qlora : {false, true}) {
    Fixture f;
    auto adapter = f.attach({.rank = 2, .alpha = 4.0f, .dropout = 0.4f, .use_dora = true, .quantize_base = qlora,
                             .seed = 5});
    adapter->set_dropout_key(9);
    std::vector<float> dx = f.backward();
    Parameter* m = adapter->parameters()[2];
    expect_matches_finite_differences([&] { return f.loss(); }, m->value.f32(), m->value.numel(), m->grad.f32(), "dm");
    expect_matches_finite_differences([&] { return f.loss(); }, f.x.data(), int64_t(f.x.size()), dx.data(), "dx");
  }
}

TEST(LoraAdapter, DoraWithDropoutKeepsTheUndroppedBaseAndIsDoraWithoutItWhenNotTraining) {
  Fixture f;
  auto adapter = f.attach({.rank = 2, .alpha = 4.0f, .dropout = 0.5f, .use_dora = true, .seed = 3});
  adapter->set_dropout_key(1);
  std::vector<float> y_train = f.forward();
  // Dropping every x' term leaves y = x Wᵀ + b: rows differ from the evaluation output, and with A and
  // B zero the output is base(x) + (c − 1) ⊙ x' Wᵀ, which equals base(x) only where c = 1.
  adapter->set_training(false);
  std::vector<float> y_eval = f.forward();
  double differ = 0;
  for (size_t i = 0; i < y_eval.size(); ++i) differ = std::max(differ, double(std::fabs(y_train[i] - y_eval[i])));
  EXPECT_GT(differ, 1e-3) << "dropout had no effect in training";
  // Evaluation: exactly DoRA without dropout, y = c ⊙ (x Wᵀ + s B A x) + b.
  Fixture g;
  auto plain = g.attach({.rank = 2, .alpha = 4.0f, .use_dora = true, .seed = 3});
  for (size_t p = 0; p < 3; ++p) plain->parameters()[p]->value.copy_from(adapter->parameters()[p]->value);
  std::vector<float> y_plain = g.forward();
  for (size_t i = 0; i < y_eval.size(); ++i) EXPECT_FLOAT_EQ(y_eval[i], y_plain[i]);
  // With the magnitude at the row norms of W and B = 0 (c = 1), the dropped terms cancel: y = base(x).
  Fixture h;
  auto fresh = h.attach({.rank = 2, .alpha = 4.0f, .dropout = 0.5f, .use_dora = true, .seed = 3});
  fresh->parameters()[1]->value.fill_zero();
  fresh->set_dropout_key(1);
  std::vector<float> y_fresh = h.forward();
  for (int64_t n = 0; n < h.N; ++n)
    for (int64_t o = 0; o < h.out; ++o) {
      double expected = h.bias.value.f32()[o];
      for (int64_t i = 0; i < h.in; ++i) expected += double(h.x[size_t(n * h.in + i)]) * h.weight.value.f32()[o * h.in + i];
      EXPECT_NEAR(y_fresh[size_t(n * h.out + o)], expected, 1e-4 * std::max(1.0, std::fabs(expected)));
    }
}

TEST(LoraAdapter, DoraTreatsTheNormAsAConstantLikePeft) {
  // With the row norms frozen at their current values, DoRA is linear in (A, B, x) given c, so
  // finite differences of that frozen-norm function must match the adapter's gradients.
  Fixture f(/*with_bias=*/true);
  auto adapter = f.attach({.rank = 2, .alpha = 4.0f, .use_dora = true});
  std::vector<float> dx = f.backward();
  std::vector<float> c(size_t(f.out));  // m / ‖W + sBA‖ at the current point
  {
    for (int64_t o = 0; o < f.out; ++o) {
      double norm = 0;
      const float* A = adapter->parameters()[0]->value.f32();
      const float* B = adapter->parameters()[1]->value.f32();
      for (int64_t i = 0; i < f.in; ++i) {
        double v = f.weight.value.f32()[o * f.in + i];
        for (int64_t k = 0; k < 2; ++k) v += 2.0 * B[o * 2 + k] * A[k * f.in + i];
        norm += v * v;
      }
      c[size_t(o)] = float(adapter->parameters()[2]->value.f32()[o] / std::sqrt(norm));
    }
  }
  auto frozen_loss = [&] {
    const float* A = adapter->parameters()[0]->value.f32();
    const float* B = adapter->parameters()[1]->value.f32();
    double l = 0;
    for (int64_t n = 0; n < f.N; ++n)
      for (int64_t o = 0; o < f.out; ++o) {
        double pre = 0;
        for (int64_t i = 0; i < f.in; ++i) {
          double w = f.weight.value.f32()[o * f.in + i];
          for (int64_t k = 0; k < 2; ++k) w += 2.0 * B[o * 2 + k] * A[k * f.in + i];
          pre += w * f.x[size_t(n * f.in + i)];
        }
        l += (c[size_t(o)] * pre + f.bias.value.f32()[o]) * f.r[size_t(n * f.out + o)];
      }
    return l;
  };
  EXPECT_NEAR(frozen_loss(), f.loss(), 1e-3 * std::max(1.0, std::fabs(f.loss())));
  for (int i = 0; i < 2; ++i) {
    Parameter* p = adapter->parameters()[size_t(i)];
    expect_matches_finite_differences(frozen_loss, p->value.f32(), p->value.numel(), p->grad.f32(), p->name.c_str());
  }
  expect_matches_finite_differences(frozen_loss, f.x.data(), int64_t(f.x.size()), dx.data(), "dx");
}

TEST(LoraAdapter, MergedWeightReproducesTheAdaptedProjection) {
  for (bool dora : {false, true}) {
    Fixture f;
    auto adapter = f.attach({.rank = 4, .alpha = 8.0f, .use_dora = dora});
    std::vector<float> y = f.forward();
    Tensor merged = adapter->merged_weight(f.linear);
    for (int64_t n = 0; n < f.N; ++n)
      for (int64_t o = 0; o < f.out; ++o) {
        double expected = f.bias.value.f32()[o];
        for (int64_t i = 0; i < f.in; ++i) expected += double(f.x[size_t(n * f.in + i)]) * merged.f32()[o * f.in + i];
        EXPECT_NEAR(y[size_t(n * f.out + o)], expected, 1e-4 * std::max(1.0, std::fabs(expected))) << "dora " << dora;
      }
  }
}

TEST(LoraAdapter, QloraKeepsOnlyNf4AndMatchesLoraOnTheDequantisedBase) {
  Fixture f;  // out*in = 128: two NF4 blocks
  Tensor original = f.weight.value.clone();
  auto adapter = f.attach({.rank = 4, .alpha = 8.0f, .quantize_base = true});
  EXPECT_FALSE(f.weight.value.defined());  // the f32 base weight is freed
  EXPECT_LE(double(adapter->base_weight_bytes(f.linear)) / double(f.out * f.in), 0.6);
  Tensor dequantised = adapter->base_weight(f.linear);
  for (int64_t i = 0; i < f.out * f.in; ++i)
    EXPECT_NEAR(dequantised.f32()[i], original.f32()[i], 0.15 * 1.2);  // NF4 error is at most half a code gap of the block's absmax
  std::vector<float> dx = f.backward();
  auto loss = [&] { return f.loss(); };
  for (Parameter* p : adapter->parameters())
    expect_matches_finite_differences(loss, p->value.f32(), p->value.numel(), p->grad.f32(), p->name.c_str());
  expect_matches_finite_differences(loss, f.x.data(), int64_t(f.x.size()), dx.data(), "dx");
}

// The adapter's NF4 is made and read in its options' arithmetic (torchao's in the run's dtype): its
// base is the kernels' dequantisation of the kernels' quantisation in that arithmetic, for each of the
// two (bf16: every value a bf16 one), and the two differ.
TEST(LoraAdapter, QloraQuantisesInItsOptionsArithmetic) {
  std::vector<float> bases[2];
  for (cpu::Nf4Arithmetic arithmetic : {cpu::Nf4Arithmetic::kBf16, cpu::Nf4Arithmetic::kF32}) {
    Fixture f;
    const std::vector<float> original(f.weight.value.f32(), f.weight.value.f32() + f.out * f.in);
    auto adapter = f.attach({.rank = 4, .quantize_base = true, .nf4_arithmetic = arithmetic});
    const int64_t n = f.out * f.in;
    std::vector<uint8_t> codes(size_t(n / 2));
    std::vector<float> scales(size_t(n / 64)), want(static_cast<size_t>(n));
    cpu::nf4_quantize(codes.data(), scales.data(), original.data(), n, arithmetic);
    cpu::nf4_dequantize(want.data(), codes.data(), scales.data(), n, arithmetic);
    Tensor base = adapter->base_weight(f.linear);
    std::vector<float>& got = bases[arithmetic == cpu::Nf4Arithmetic::kF32];
    got.assign(base.f32(), base.f32() + n);
    EXPECT_EQ(got, want) << cpu::nf4_arithmetic_name(arithmetic);
    if (arithmetic == cpu::Nf4Arithmetic::kBf16) {
      for (float v : got) ASSERT_EQ(v, bf16_to_f32(f32_to_bf16(v)));
    }
  }
  EXPECT_NE(bases[0], bases[1]);
}

// A GPU run's host keeps a bf16 checkpoint's base as bf16 (mapped, not copied to f32): QLoRA
// quantises it to the codes of its values widened to f32 (across the widening's chunks: 320 x 256
// values, more than one), and DoRA starts its magnitudes from them, as for the same values in f32.
TEST(LoraAdapter, ABf16BaseQuantisesAndMergesAsItsValuesInF32) {
  const int64_t out = 320, in = 256;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 0.3f);
  Tensor narrow = Tensor::empty({out, in}, DType::BF16);
  for (int64_t i = 0; i < out * in; ++i) narrow.bf16()[i] = f32_to_bf16(normal(rng));
  const Tensor wide = narrow.to(DType::F32);
  for (const LoraOptions& options : {LoraOptions{.rank = 4, .quantize_base = true},
                                     LoraOptions{.rank = 4, .use_dora = true, .quantize_base = true},
                                     LoraOptions{.rank = 4, .use_dora = true}}) {
    SCOPED_TRACE(std::string(options.quantize_base ? "QLoRA" : "") + (options.use_dora ? " DoRA" : ""));
    Parameter weight[2];
    Linear linear[2];
    std::shared_ptr<LoraAdapter> adapter[2];
    for (int k = 0; k < 2; ++k) {
      weight[k] = Parameter{"model.layers.0.mlp.up_proj.weight", k == 0 ? wide.clone() : narrow.clone(), Tensor(), false};
      linear[k].name = "model.layers.0.mlp.up_proj";
      linear[k].weight = &weight[k];
      linear[k].in = in;
      linear[k].out = out;
      adapter[k] = std::make_shared<LoraAdapter>(linear[k], options);
    }
    const Tensor from_f32 = adapter[0]->merged_weight(linear[0]), from_bf16 = adapter[1]->merged_weight(linear[1]);
    EXPECT_EQ(std::memcmp(from_f32.raw(), from_bf16.raw(), from_f32.bytes()), 0) << "merged weights differ";
    const Tensor base_f32 = adapter[0]->base_weight(linear[0]), base_bf16 = adapter[1]->base_weight(linear[1]);
    ASSERT_EQ(base_bf16.dtype(), DType::F32);
    EXPECT_EQ(std::memcmp(base_f32.raw(), base_bf16.raw(), base_f32.bytes()), 0) << "base weights differ";
    if (options.use_dora) {
      const Tensor& m0 = adapter[0]->parameters().back()->value;
      const Tensor& m1 = adapter[1]->parameters().back()->value;
      EXPECT_EQ(std::memcmp(m0.raw(), m1.raw(), m0.bytes()), 0) << "magnitudes differ";
    }
    // QLoRA: the same codes in the same bytes; otherwise the weight as it is stored.
    EXPECT_EQ(adapter[1]->base_weight_bytes(linear[1]),
              options.quantize_base ? adapter[0]->base_weight_bytes(linear[0]) : size_t(2 * out * in));
  }
}

// A base mapped in its file's f32 under bf16 storage (Gemma 2's f32 checkpoints on a GPU run: mapped,
// not copied to bf16 on every rank) is read as its bf16 copy: QLoRA's codes made on demand, DoRA's
// magnitudes, the base and the merged weight all equal those of the bf16 copy bit for bit (the
// quantiser across more than one of its chunks: 320 x 256 values). Read as f32, they would differ.
TEST(LoraAdapter, AnF32BaseStoredAsBf16QuantisesAndMergesAsItsBf16Copy) {
  const int64_t out = 320, in = 256;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 0.3f);
  Tensor wide = Tensor::empty({out, in});
  for (int64_t i = 0; i < out * in; ++i) wide.f32()[i] = normal(rng);
  const Tensor narrow = wide.to(DType::BF16);
  for (const LoraOptions& options : {LoraOptions{.rank = 4, .quantize_base = true, .nf4_on_demand = true},
                                     LoraOptions{.rank = 4, .use_dora = true, .quantize_base = true, .nf4_on_demand = true},
                                     LoraOptions{.rank = 4, .use_dora = true}, LoraOptions{.rank = 4}}) {
    SCOPED_TRACE(std::string(options.quantize_base ? "QLoRA" : "LoRA") + (options.use_dora ? " DoRA" : ""));
    Parameter weight[2];
    Linear linear[2];
    std::shared_ptr<LoraAdapter> adapter[2];
    for (int k = 0; k < 2; ++k) {
      weight[k] = Parameter{"model.layers.0.mlp.up_proj.weight", k == 0 ? wide : narrow.clone(), Tensor(), false};
      if (k == 0) weight[k].stored_dtype = DType::BF16;
      linear[k].name = "model.layers.0.mlp.up_proj";
      linear[k].weight = &weight[k];
      linear[k].in = in;
      linear[k].out = out;
      adapter[k] = std::make_shared<LoraAdapter>(linear[k], options);
    }
    EXPECT_EQ(weight[0].value.raw(), wide.raw()) << "the mapped value was replaced";
    EXPECT_EQ(weight[0].value.dtype(), DType::F32);
    for (const auto& [what, a, b] :
         {std::tuple{"base", adapter[0]->base_weight(linear[0]), adapter[1]->base_weight(linear[1])},
          std::tuple{"merged", adapter[0]->merged_weight(linear[0]), adapter[1]->merged_weight(linear[1])}}) {
      ASSERT_EQ(a.dtype(), DType::F32) << what;
      ASSERT_EQ(a.bytes(), b.bytes()) << what;
      EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.bytes()), 0) << what << " weights differ";
    }
    if (options.use_dora) {
      const Tensor& m0 = adapter[0]->parameters().back()->value;
      const Tensor& m1 = adapter[1]->parameters().back()->value;
      EXPECT_EQ(std::memcmp(m0.raw(), m1.raw(), m0.bytes()), 0) << "magnitudes differ";
    }
  }
  // The check can fail: read as its f32 values, the base differs from the bf16 copy's.
  Parameter unrounded{"model.layers.0.mlp.up_proj.weight", wide, Tensor(), false};
  Linear linear;
  linear.name = "model.layers.0.mlp.up_proj";
  linear.weight = &unrounded;
  linear.in = in;
  linear.out = out;
  LoraAdapter plain(linear, {.rank = 4});
  const Tensor widened_copy = narrow.to(DType::F32);
  EXPECT_NE(std::memcmp(plain.base_weight(linear).raw(), widened_copy.raw(), widened_copy.bytes()), 0);
}

// LoraOptions::dora_magnitudes_later: the magnitudes start at 0 and init_dora_magnitude makes the
// ones the constructor would have, bit for bit (DoRA, and QLoRA + DoRA with its codes on demand).
TEST(LoraAdapter, DoraMagnitudesMadeLaterAreTheConstructorsBitForBit) {
  for (bool qlora : {false, true}) {
    SCOPED_TRACE(qlora ? "QLoRA + DoRA" : "DoRA");
    Fixture now_f, later_f;
    for (Fixture* f : {&now_f, &later_f}) f->weight.value = f->weight.value.to(DType::BF16);  // a GPU run's base
    const LoraOptions options{.rank = 4, .alpha = 8.0f, .use_dora = true, .quantize_base = qlora, .nf4_on_demand = qlora};
    LoraOptions later_options = options;
    later_options.dora_magnitudes_later = true;
    auto now = now_f.attach(options);
    auto later = later_f.attach(later_options);
    const Tensor& m_now = now->parameters().back()->value;
    const Tensor& m_later = later->parameters().back()->value;
    ASSERT_EQ(m_now.numel(), m_later.numel());
    for (int64_t i = 0; i < m_later.numel(); ++i) ASSERT_EQ(m_later.f32()[i], 0.0f) << i;
    later->init_dora_magnitude(later_f.linear);
    EXPECT_EQ(std::memcmp(m_now.raw(), m_later.raw(), m_now.bytes()), 0) << "magnitudes differ";
  }
  Fixture plain_f;
  auto plain = plain_f.attach({.rank = 4});
  EXPECT_THROW(plain->init_dora_magnitude(plain_f.linear), Error);
}

// QLoRA with its codes made on demand (a GPU run's host model): the base stays the Linear's value
// and the adapter holds no codes, yet its base, merged weight and DoRA magnitudes are the eager
// path's bit for bit (from f32 and from bf16 values); every pass refuses, naming the module.
TEST(LoraAdapter, QloraWithItsCodesMadeOnDemandHoldsNoneAndMergesAsTheEagerPath) {
  for (bool dora : {false, true})
    for (DType storage : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(std::string(dora ? "DoRA, " : "") + dtype_name(storage));
      Fixture eager_f, lazy_f;
      for (Fixture* f : {&eager_f, &lazy_f}) f->weight.value = f->weight.value.to(storage).to(DType::F32);
      lazy_f.weight.value = lazy_f.weight.value.to(storage);
      const Tensor kept = lazy_f.weight.value;
      auto eager = eager_f.attach({.rank = 4, .alpha = 8.0f, .use_dora = dora, .quantize_base = true});
      auto lazy = lazy_f.attach({.rank = 4, .alpha = 8.0f, .use_dora = dora, .quantize_base = true, .nf4_on_demand = true});
      EXPECT_FALSE(eager_f.weight.value.defined());
      ASSERT_TRUE(lazy_f.weight.value.defined()) << "the base value was freed";
      EXPECT_EQ(lazy_f.weight.value.raw(), kept.raw()) << "the base value was replaced";
      EXPECT_EQ(lazy->base_weight_bytes(lazy_f.linear), 0u);
      EXPECT_GT(eager->base_weight_bytes(eager_f.linear), 0u);
      for (const auto& [a, b] : {std::pair{eager->base_weight(eager_f.linear), lazy->base_weight(lazy_f.linear)},
                                 std::pair{eager->merged_weight(eager_f.linear), lazy->merged_weight(lazy_f.linear)},
                                 std::pair{eager->parameters().back()->value, lazy->parameters().back()->value}}) {
        ASSERT_EQ(a.bytes(), b.bytes());
        EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.bytes()), 0);
      }
      try {
        lazy_f.forward();
        ADD_FAILURE() << "a host model without codes computed";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("model.layers.0.self_attn.q_proj"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("made on demand"), std::string::npos) << e.what();
      }
    }
}

// A GPU run's ranks other than 0 free the QLoRA base the GPU holds: nothing left, and every use of it
// refused, naming the module (not a read of freed codes).
TEST(LoraAdapter, QloraReleasedBaseFreesTheCodesAndRefusesToCompute) {
  Fixture f;
  auto adapter = f.attach({.rank = 4, .alpha = 8.0f, .quantize_base = true});
  ASSERT_GT(adapter->base_weight_bytes(f.linear), 0u);
  adapter->release_base();
  EXPECT_EQ(adapter->base_weight_bytes(f.linear), 0u);
  for (const auto& use : std::vector<std::function<void()>>{[&] { adapter->base_weight(f.linear); },
                                                            [&] { adapter->merged_weight(f.linear); },
                                                            [&] { f.loss(); }}) {
    try {
      use();
      ADD_FAILURE() << "a released base was used";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("NF4 base was released"), std::string::npos) << e.what();
    }
  }
}

TEST(LoraAdapter, RefusesWhatItDoesNotSupport) {
  Fixture f;
  EXPECT_THROW(LoraAdapter(f.linear, {.rank = 0}), Error);
  EXPECT_THROW(LoraAdapter(f.linear, {.rank = 2, .dropout = 1.0f}), Error);
  EXPECT_THROW(lora_target_modules({.attn_modules = {"qkv"}}), Error);
  EXPECT_EQ(lora_target_modules({.attn_modules = {"q_proj"}, .apply_to_output = true}),
            (std::vector<std::string>{"q_proj", "lm_head"}));
  EXPECT_EQ(lora_target_modules({.attn_modules = {"q_proj", "output_proj"}, .apply_to_mlp = true}),
            (std::vector<std::string>{"q_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}));
}

// ---- On the output projection (lm_head): the fused loss path ----
namespace {

struct HeadFixture {
  int64_t N = 9, C = 16, V = 40;  // V*C divisible by 64 (QLoRA)
  Parameter weight;
  Linear linear;
  std::vector<float> hidden;
  std::vector<int32_t> labels;
  explicit HeadFixture(uint32_t seed = 3) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    weight.name = "lm_head.weight";
    weight.value = Tensor::empty({V, C});
    for (int64_t i = 0; i < V * C; ++i) weight.value.f32()[i] = 0.3f * normal(rng);
    weight.trainable = false;
    linear.name = "lm_head";
    linear.weight = &weight;
    linear.in = C;
    linear.out = V;
    hidden.resize(size_t(N * C));
    for (float& v : hidden) v = normal(rng);
    labels.resize(size_t(N));
    for (int64_t n = 0; n < N; ++n) labels[size_t(n)] = int32_t((n * 13 + 5) % V);
    labels[0] = labels[4] = -100;  // ignored rows: no gradient may reach them
  }
  std::shared_ptr<LoraAdapter> attach(const LoraOptions& options) {
    auto adapter = std::make_shared<LoraAdapter>(linear, options);
    linear.adapter = adapter;
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 0.5f);
    for (Parameter* p : adapter->parameters()) {
      if (p->name.find("lora_B") != std::string::npos)
        for (int64_t i = 0; i < p->value.numel(); ++i) p->value.f32()[i] = normal(rng);
      p->grad = Tensor::zeros(p->value.shape());
      p->trainable = true;
    }
    return adapter;
  }
  double loss(LoraAdapter& a, float* dhidden = nullptr) {
    std::vector<float> scratch(a.fused_output_scratch_floats(4));
    return a.fused_output_cross_entropy(dhidden, nullptr, hidden.data(), weight.value.defined() ? weight.value.f32() : nullptr,
                                        labels.data(), N, 0.0f, 1.0f, dhidden != nullptr, 4, scratch.data());
  }
  // The same loss from the materialised projection (Linear::forward through the adapter), in double.
  double materialised_loss() {
    std::vector<float> y(size_t(N * V)), saved(size_t(std::max<int64_t>(1, linear.saved_floats(N))));
    linear.forward(y.data(), hidden.data(), N, saved.data(), nullptr);
    double total = 0;
    for (int64_t n = 0; n < N; ++n) {
      if (labels[size_t(n)] == -100) continue;
      double m = -1e300, sum = 0;
      for (int64_t v = 0; v < V; ++v) m = std::max(m, double(y[size_t(n * V + v)]));
      for (int64_t v = 0; v < V; ++v) sum += std::exp(double(y[size_t(n * V + v)]) - m);
      total += m + std::log(sum) - y[size_t(n * V + labels[size_t(n)])];
    }
    return total;
  }
};

}  // namespace

TEST(LoraAdapter, OutputHeadFusedLossEqualsTheMaterialisedProjection) {
  for (int variant = 0; variant < 5; ++variant) {  // LoRA, LoRA + dropout, DoRA, QLoRA + dropout, DoRA + dropout
    HeadFixture f;
    LoraOptions o{.rank = 3, .alpha = 6.0f, .dropout = variant % 2 || variant == 4 ? 0.3f : 0.0f,
                  .use_dora = variant == 2 || variant == 4, .quantize_base = variant == 3, .seed = 4};
    auto adapter = f.attach(o);
    adapter->set_dropout_key(5);
    const double fused = f.loss(*adapter);
    EXPECT_NEAR(fused, f.materialised_loss(), 1e-4 * std::fabs(fused)) << "variant " << variant;
  }
}

TEST(LoraAdapter, OutputHeadGradientsMatchFiniteDifferences) {
  // LoRA with dropout (a fixed mask) and QLoRA: every gradient; DoRA, without and with dropout: m and
  // the input (A and B move the detached norm, which the PEFT step parity covers).
  for (int variant = 0; variant < 4; ++variant) {
    HeadFixture f;
    LoraOptions o{.rank = 3, .alpha = 6.0f, .dropout = variant == 0 || variant == 3 ? 0.3f : 0.0f,
                  .use_dora = variant == 1 || variant == 3, .quantize_base = variant == 2, .seed = 4};
    auto adapter = f.attach(o);
    adapter->set_dropout_key(5);
    std::vector<float> dhidden(f.hidden.size(), NAN);
    f.loss(*adapter, dhidden.data());
    for (int64_t i = 0; i < f.C; ++i) {  // ignored rows get exactly zero
      EXPECT_EQ(dhidden[size_t(0 * f.C + i)], 0.0f);
      EXPECT_EQ(dhidden[size_t(4 * f.C + i)], 0.0f);
    }
    auto loss = [&] { return f.loss(*adapter); };
    const std::string tag = " variant " + std::to_string(variant);
    for (Parameter* p : adapter->parameters()) {
      if (o.use_dora && p->name.find("magnitude") == std::string::npos) continue;
      expect_matches_finite_differences(loss, p->value.f32(), p->value.numel(), p->grad.f32(), (p->name + tag).c_str());
    }
    expect_matches_finite_differences(loss, f.hidden.data(), int64_t(f.hidden.size()), dhidden.data(),
                                      ("dhidden" + tag).c_str());
  }
}
