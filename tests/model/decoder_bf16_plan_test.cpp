// What the decoder plans for bf16 weights multiplied as bf16 against the widened path (the scratch
// is planned, not run, so these are byte counts): no f32 copy of the (V, C) head and no f32 (V, C)
// gradient for it; and an adapted head (LoRA on lm_head, whose fused loss widens its base either
// way) gets no (N, V) bf16 staging either, and trains as on the widened path within bf16 rounding.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>
#include <string>

#include "model/adapters/lora_adapter.h"
#include "model/decoder.h"
#include "scoped_bf16_gemm.h"

using namespace ktune;
using namespace ktune::model;
using ktune::testing::ScopedBf16Gemm;

namespace {

struct PlannedBytes {
  size_t widened = 0, bf16_gemm = 0;
};

PlannedBytes plans(const Decoder& m, int64_t B, int64_t T) {
  PlannedBytes out;
  {
    ScopedBf16Gemm widen("widen");
    out.widened = m.planned_activation_bytes(B, T);
  }
  ScopedBf16Gemm native("bf16");
  out.bf16_gemm = m.planned_activation_bytes(B, T);
  return out;
}

}  // namespace

TEST(DecoderBf16Plan, Bf16GemmsPlanNeitherAWidenedHeadNorAnF32HeadGradient) {
  // V * C = 2 Mi floats, above the head's 1 Mi-float dW block, so what the widened path holds twice
  // (the head and its gradient, 8 MiB each) is not hidden by the block.
  const int64_t V = 32768, C = 64, B = 1, T = 16;
  ModelConfig c = ModelConfig::llama_like(V, C, /*layers*/ 1, /*heads*/ 4, /*kv_heads*/ 2, /*intermediate*/ 128);
  c.tie_word_embeddings = true;
  Decoder m(c, /*seed*/ 1, DType::BF16);
  m.set_trainable([](const std::string&) { return true; });
  const PlannedBytes p = plans(m, B, T);
  // Saved: 2 (V, C) f32; added: the chunk's bf16 dlogits (T * V halves), a 4 MiB dW block, bf16 x/dy.
  EXPECT_GE(p.widened, p.bf16_gemm + size_t(V * C) * sizeof(float))
      << "widened " << p.widened << " bytes, bf16 GEMMs " << p.bf16_gemm;
}

TEST(DecoderBf16Plan, ALoraHeadOnABf16BaseGetsNoLogitSizedStaging) {
  const int64_t V = 4096, C = 64, B = 4, T = 64, I = 128;
  ModelConfig c = ModelConfig::llama_like(V, C, /*layers*/ 1, /*heads*/ 4, /*kv_heads*/ 2, I);
  c.tie_word_embeddings = false;
  Decoder m(c, /*seed*/ 1, DType::BF16);
  LoraOptions options;
  options.rank = 4;
  attach_lora(m, LoraTargets{{"q_proj", "v_proj"}, false, /*apply_to_output*/ true}, options);
  const PlannedBytes p = plans(m, B, T);
  // The projections' bf16 operands add at most N * (C + I) bf16 values; an (N, V) bf16 buffer for the
  // head (what a Linear's backward would stage) would add N * V.
  const size_t N = size_t(B * T);
  EXPECT_LE(p.bf16_gemm, p.widened + N * size_t(C + I) * 2) << "widened " << p.widened << ", bf16 GEMMs " << p.bf16_gemm;
}

TEST(DecoderBf16Plan, ALoraHeadOnABf16BaseTrainsAsOnTheWidenedPathWithinBf16Rounding) {
  const int64_t V = 97, C = 48, B = 2, T = 12;
  ModelConfig c = ModelConfig::llama_like(V, C, /*layers*/ 2, /*heads*/ 4, /*kv_heads*/ 2, /*intermediate*/ 72);
  c.tie_word_embeddings = false;
  std::vector<int32_t> tokens(size_t(B * T)), labels(size_t(B * T));
  for (int64_t i = 0; i < B * T; ++i) {
    tokens[size_t(i)] = int32_t((i * 13 + 5) % V);
    labels[size_t(i)] = i % 5 == 0 ? -100 : int32_t((i * 7 + 1) % V);
  }
  double loss[2];
  std::vector<std::vector<float>> grads[2];
  for (int native = 0; native < 2; ++native) {
    ScopedBf16Gemm mode(native ? "bf16" : "widen");
    Decoder m(c, /*seed*/ 1, DType::BF16);
    LoraOptions options;
    options.rank = 4;
    auto adapters = attach_lora(m, LoraTargets{{"q_proj", "v_proj"}, true, /*apply_to_output*/ true}, options);
    for (auto& a : adapters)  // B starts at zero: give it values so every path carries signal
      for (Parameter* p : a->parameters())
        if (p->name.find("lora_B") != std::string::npos)
          for (int64_t i = 0; i < p->value.numel(); ++i) p->value.f32()[i] = 0.01f * float((i * 7) % 13 - 6);
    loss[native] = m.forward_backward({tokens.data(), labels.data(), nullptr, nullptr, B, T}, 1.0f).loss_sum;
    for (Parameter* p : m.parameters())
      if (p->trainable) grads[native].emplace_back(p->grad.f32(), p->grad.f32() + p->grad.numel());
  }
  // Measured: loss 1.4e-5 relative, adapter gradients 8.3e-3 (max error / max |widened|).
  EXPECT_NEAR(loss[1], loss[0], 1e-4 * loss[0]);
  ASSERT_EQ(grads[0].size(), grads[1].size());
  ASSERT_GT(grads[0].size(), 0u);
  for (size_t k = 0; k < grads[0].size(); ++k) {  // max error / max |widened|, as the parity tests measure
    double diff = 0, scale = 0;
    for (size_t i = 0; i < grads[0][k].size(); ++i) {
      diff = std::max(diff, double(std::fabs(grads[1][k][i] - grads[0][k][i])));
      scale = std::max(scale, double(std::fabs(grads[0][k][i])));
    }
    EXPECT_GT(scale, 0.0) << k;
    EXPECT_LE(diff, 2e-2 * scale) << "adapter parameter " << k;
  }
}

// Gemma's embedding scale, sqrt(hidden_size), is rounded to bf16 for a bf16 model as HF rounds its
// normalizer to the hidden states' dtype: a width whose root is not a bf16 value (48: 6.928...,
// Gemma2 9B's 3584: 59.87 -> 60) shows the rounding; the reference is torch's own bf16 value.
TEST(GemmaEmbedScale, IsSqrtHiddenRoundedToBf16InABf16Model) {
  ModelConfig config = ModelConfig::from_json_text(R"({"model_type":"gemma2","vocab_size":32,"hidden_size":48,
    "intermediate_size":96,"num_hidden_layers":1,"num_attention_heads":2,"num_key_value_heads":1,"head_dim":24})",
                                                   "config.json");
  EXPECT_FLOAT_EQ(Decoder(config, 0, DType::F32).embed_scale(), float(std::sqrt(48.0)));
  const float bf16_scale = Decoder(config, 0, DType::BF16).embed_scale();
  EXPECT_NE(bf16_scale, float(std::sqrt(48.0)));
  if (std::system("python3 -c 'import torch' 2>/dev/null") != 0) GTEST_SKIP() << "torch is not installed";
  FILE* p = popen("python3 -c 'import torch; print(repr(float(torch.tensor(48 ** 0.5, dtype=torch.bfloat16))))'", "r");
  char text[64] = {0};
  ASSERT_NE(std::fgets(text, sizeof text, p), nullptr);
  ASSERT_EQ(pclose(p), 0);
  EXPECT_EQ(bf16_scale, std::strtof(text, nullptr)) << text;
}

