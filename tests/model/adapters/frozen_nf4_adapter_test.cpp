// FrozenNf4Adapter (torchtune's FrozenNF4Linear): a decoder whose unadapted layer projections hold
// their bases in NF4 computes what the same decoder computes with those weights replaced by their
// dequantised NF4, made independently (kernels/cpu/nf4.h's plain reference, itself held to torchao's
// output by tests/kernels/nf4_test.cpp); and which projections torchtune's QLoRA quantises.
#include "model/adapters/frozen_nf4_adapter.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/nf4.h"
#include "model/adapters/lora_adapter.h"
#include "model/decoder.h"

using namespace ktune;
using namespace ktune::model;

namespace {

// Llama-shaped, untied (lm_head a Linear of its own), every projection a whole number of NF4 blocks.
std::unique_ptr<Decoder> tiny_llama() {
  ModelConfig config = ModelConfig::llama_like(/*vocab=*/96, /*hidden=*/64, /*layers=*/2, /*heads=*/4,
                                               /*kv_heads=*/2, /*intermediate=*/128);
  config.tie_word_embeddings = false;
  return std::make_unique<Decoder>(config, 11);
}

// W dequantised from the plain reference quantiser in `arithmetic`: (out, in).
std::vector<float> reference_nf4(const Tensor& weight, cpu::Nf4Arithmetic arithmetic) {
  const int64_t n = weight.numel();
  std::vector<uint8_t> codes(static_cast<size_t>(n / 2));
  std::vector<float> scales(static_cast<size_t>(n / cpu::kNf4BlockSize)), values(static_cast<size_t>(n));
  cpu::nf4_quantize_reference(codes.data(), scales.data(), weight.f32(), n, arithmetic);
  cpu::nf4_dequantize(values.data(), codes.data(), scales.data(), n, arithmetic);
  return values;
}

const LoraTargets kQV{{"q_proj", "v_proj"}, false, false};

LoraOptions qlora_options() {
  LoraOptions options;
  options.rank = 4;
  options.alpha = 8.0f;
  options.quantize_base = true;
  options.nf4_arithmetic = cpu::Nf4Arithmetic::kBf16;
  options.seed = 5;
  return options;
}

struct Tokens {
  std::vector<int32_t> tokens, labels;
  Batch batch() const { return {tokens.data(), labels.data(), nullptr, nullptr, 2, 6}; }
};

Tokens tokens() {
  Tokens t;
  for (int i = 0; i < 12; ++i) {
    t.tokens.push_back(int32_t((i * 37 + 5) % 96));
    t.labels.push_back(i % 6 == 5 ? -100 : int32_t((i * 53 + 1) % 96));
  }
  return t;
}

bool is_layer_projection(const std::string& module) { return module.rfind("model.layers.", 0) == 0; }

}  // namespace

TEST(FrozenNf4Adapter, TorchtunesQloraBuildersQuantiseTheUnadaptedProjectionsOfAllButQwen2) {
  EXPECT_TRUE(qlora_quantizes_unadapted(Family::Llama));
  EXPECT_TRUE(qlora_quantizes_unadapted(Family::Mistral));
  EXPECT_TRUE(qlora_quantizes_unadapted(Family::Gemma2));
  EXPECT_FALSE(qlora_quantizes_unadapted(Family::Qwen2));
}

// Attached after LoRA: every layer projection without an adapter, and nothing else (lm_head and the
// embeddings keep their values); each holds only NF4 (about half a byte a weight) and no parameter.
TEST(FrozenNf4Adapter, AttachesToEveryUnadaptedLayerProjectionAndKeepsOnlyNf4) {
  auto decoder = tiny_llama();
  const Tensor lm_head = decoder->parameter("lm_head.weight").value;
  auto lora = attach_lora(*decoder, kQV, qlora_options());
  auto frozen = attach_frozen_nf4(*decoder, cpu::Nf4Arithmetic::kBf16, false);
  EXPECT_EQ(lora.size(), 2u * 2);
  ASSERT_EQ(frozen.size(), 2u * 5);  // k, o, gate, up, down of two layers
  for (const auto& f : frozen) {
    const std::string suffix = module_suffix(f->module_name());
    EXPECT_TRUE(suffix != "q_proj" && suffix != "v_proj" && is_layer_projection(f->module_name())) << f->module_name();
    const Linear& linear = decoder->linear(f->module_name());
    EXPECT_EQ(linear.adapter.get(), f.get());
    EXPECT_FALSE(linear.weight->value.defined()) << f->module_name() << ": the base value is freed";
    EXPECT_FALSE(linear.weight->trainable);
    EXPECT_TRUE(f->parameters().empty());
    const size_t n = size_t(linear.in * linear.out);
    // the codes, a byte a block (its int8 scaler), an f32 a group of 256 blocks and the mean
    EXPECT_EQ(f->base_weight_bytes(), n / 2 + n / 64 + ((n / 64 + 255) / 256 + 1) * sizeof(float)) << f->module_name();
  }
  EXPECT_EQ(decoder->linear("lm_head").adapter, nullptr);
  EXPECT_EQ(decoder->parameter("lm_head.weight").value.raw(), lm_head.raw()) << "lm_head must stay as it is";
  for (Parameter* p : decoder->parameters())
    EXPECT_EQ(p->trainable, p->name.rfind("base_model.model.", 0) == 0) << p->name;
}

// The QLoRA decoder with frozen NF4 bases against the same decoder where each quantised weight is
// replaced by its reference dequantisation (plain Linears; LoRA on the dequantised q, v): the same
// logits, loss and LoRA gradients (the same products, summed in another order), and a merged weight
// that is exactly the reference dequantisation.
TEST(FrozenNf4Adapter, ComputesAndMergesAsItsDequantisedWeightInAPlainLinear) {
  for (cpu::Nf4Arithmetic arithmetic : {cpu::Nf4Arithmetic::kBf16, cpu::Nf4Arithmetic::kF32}) {
    SCOPED_TRACE(cpu::nf4_arithmetic_name(arithmetic));
    auto quantised = tiny_llama(), reference = tiny_llama();
    // The reference's every layer projection (LoRA's bases included) as its NF4 dequantisation.
    std::map<std::string, std::vector<float>> dequantised;
    for (Linear* linear : reference->linears()) {
      if (!is_layer_projection(linear->name)) continue;
      std::vector<float> values = reference_nf4(linear->weight->value, arithmetic);
      std::memcpy(linear->weight->value.f32(), values.data(), values.size() * sizeof(float));
      dequantised[linear->name] = std::move(values);
    }
    LoraOptions options = qlora_options();
    options.nf4_arithmetic = arithmetic;
    auto lora_q = attach_lora(*quantised, kQV, options);
    auto frozen = attach_frozen_nf4(*quantised, arithmetic, false);
    options.quantize_base = false;
    auto lora_r = attach_lora(*reference, kQV, options);
    ASSERT_EQ(lora_q.size(), lora_r.size());
    for (size_t i = 0; i < lora_q.size(); ++i) {  // B non-zero, the same on both, so the adapters carry signal
      Tensor& b_q = lora_q[i]->parameters()[1]->value;
      for (int64_t j = 0; j < b_q.numel(); ++j) b_q.f32()[j] = 0.05f * std::sin(float(j + 7 * i));
      lora_r[i]->parameters()[1]->value.copy_from(b_q);
    }

    for (const auto& f : frozen) {
      const Tensor merged = f->merged_weight(quantised->linear(f->module_name()));
      const std::vector<float>& want = dequantised.at(f->module_name());
      ASSERT_EQ(size_t(merged.numel()), want.size());
      EXPECT_EQ(std::memcmp(merged.f32(), want.data(), want.size() * sizeof(float)), 0)
          << f->module_name() << ": the merged weight is not the reference dequantisation";
    }

    const Tokens t = tokens();
    const Tensor logits_q = quantised->forward_logits(t.batch()), logits_r = reference->forward_logits(t.batch());
    double worst = 0;
    for (int64_t i = 0; i < logits_q.numel(); ++i)
      worst = std::max(worst, double(std::fabs(logits_q.f32()[i] - logits_r.f32()[i])));
    EXPECT_LT(worst, 1e-4) << "logits differ";

    quantised->zero_grad();
    reference->zero_grad();
    const LossResult loss_q = quantised->forward_backward(t.batch(), 0.1f);
    const LossResult loss_r = reference->forward_backward(t.batch(), 0.1f);
    EXPECT_EQ(loss_q.n_valid, loss_r.n_valid);
    EXPECT_NEAR(loss_q.loss_sum, loss_r.loss_sum, 1e-5 * std::fabs(loss_r.loss_sum));
    for (size_t i = 0; i < lora_q.size(); ++i)
      for (size_t k = 0; k < 2; ++k) {
        const Tensor& g_q = lora_q[i]->parameters()[k]->grad;
        const Tensor& g_r = lora_r[i]->parameters()[k]->grad;
        double scale = 0, diff = 0;
        for (int64_t j = 0; j < g_r.numel(); ++j) {
          scale = std::max(scale, double(std::fabs(g_r.f32()[j])));
          diff = std::max(diff, double(std::fabs(g_q.f32()[j] - g_r.f32()[j])));
        }
        EXPECT_GT(scale, 0.0) << lora_q[i]->module_name();
        EXPECT_LT(diff, 1e-4 * scale) << lora_q[i]->module_name() << " " << lora_q[i]->parameters()[k]->name;
      }
  }
}

// On demand (a GPU run's host): the base value stays, no codes are held, the merge makes the eager
// path's codes; the passes refuse. Released: nothing held, every use refused, naming the module.
TEST(FrozenNf4Adapter, OnDemandMergesAsTheEagerPathAndAReleasedBaseIsRefused) {
  auto eager = tiny_llama(), lazy = tiny_llama();
  const std::string module = "model.layers.1.self_attn.k_proj";
  const Tensor kept = lazy->parameter(module + ".weight").value;
  auto eager_frozen = attach_frozen_nf4(*eager, cpu::Nf4Arithmetic::kBf16, false);
  auto lazy_frozen = attach_frozen_nf4(*lazy, cpu::Nf4Arithmetic::kBf16, true);
  ASSERT_EQ(eager_frozen.size(), lazy_frozen.size());
  EXPECT_EQ(lazy->parameter(module + ".weight").value.raw(), kept.raw()) << "the base value was replaced";
  for (size_t i = 0; i < eager_frozen.size(); ++i) {
    EXPECT_EQ(lazy_frozen[i]->base_weight_bytes(), 0u);
    const Tensor a = eager_frozen[i]->merged_weight(eager->linear(eager_frozen[i]->module_name()));
    const Tensor b = lazy_frozen[i]->merged_weight(lazy->linear(lazy_frozen[i]->module_name()));
    ASSERT_EQ(a.bytes(), b.bytes());
    EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.bytes()), 0) << eager_frozen[i]->module_name();
  }
  const Tokens t = tokens();
  auto expect_refused = [&](const std::function<void()>& use, const std::string& module_name, const char* why) {
    try {
      use();
      ADD_FAILURE() << "expected a refusal: " << why;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(module_name), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  expect_refused([&] { lazy->forward_logits(t.batch()); }, "model.layers.0.self_attn.q_proj", "made on demand");

  for (const auto& f : eager_frozen) f->release_base();
  EXPECT_EQ(eager_frozen[0]->base_weight_bytes(), 0u);
  expect_refused([&] { eager_frozen[0]->merged_weight(eager->linear(eager_frozen[0]->module_name())); },
                 eager_frozen[0]->module_name(), "NF4 base was released");
  expect_refused([&] { eager->forward_logits(t.batch()); }, "model.layers.0.self_attn.q_proj", "NF4 base was released");
}
