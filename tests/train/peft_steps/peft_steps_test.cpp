// The first training steps of LoRA and DoRA fine-tunes, step by step against PyTorch + PEFT: the
// same model (tests/model/fixtures/llama, or its untied variant for LoRA on lm_head), the same
// adapter init, the same batch, and with dropout the same mask (the fixture script redraws ktune's);
// at each step the loss and every adapter gradient must match, and after the last, the adapter weights.
// The fixtures come from make_peft_steps_fixture.py beside this file (torch.optim.AdamW, PEFT).
// The step is the trainer's: zero_grad, forward_backward with grad_scale 1/n_valid, AdamW.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/safetensors.h"
#include "model/adapters/lora_adapter.h"
#include "model/decoder.h"
#include "train/optimizer.h"

using namespace ktune;

namespace {

const std::string kDir = std::string(KTUNE_SOURCE_DIR) + "/tests/train/peft_steps/";
const std::string kModel = std::string(KTUNE_SOURCE_DIR) + "/tests/model/fixtures/llama";
const std::string kUntiedModel = kDir + "untied_llama";

// max |a - b| / max(max |b|, tiny): one number per tensor, robust to entries near zero.
double relative_max_error(const float* a, const float* b, int64_t n) {
  double diff = 0, scale = 1e-12;
  for (int64_t i = 0; i < n; ++i) {
    diff = std::max(diff, double(std::fabs(a[i] - b[i])));
    scale = std::max(scale, double(std::fabs(b[i])));
  }
  return diff / scale;
}

std::vector<int32_t> as_i32(const Tensor& t) {
  std::vector<int32_t> out(size_t(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) out[size_t(i)] = int32_t(t.data<int64_t>()[i]);
  return out;
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  size_t begin = 0;
  while (begin <= text.size()) {
    size_t end = text.find(',', begin);
    if (end == std::string::npos) end = text.size();
    out.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  return out;
}

// Maximum relative errors over all steps, for the report line each test prints.
struct Worst {
  double loss = 0, grad = 0, final_weight = 0;
};

void check_steps(const std::string& fixture_name, bool use_dora, const std::string& model_dir = kModel) {
  Worst worst;
  io::SafetensorsFile fixture = io::SafetensorsFile::open(kDir + fixture_name);
  Tensor settings = fixture.to_f32("settings");  // lr, beta1, beta2, eps, weight_decay, scale[, dropout, seed]
  std::vector<double> s(settings.f32(), settings.f32() + settings.numel());
  std::vector<std::string> peft_targets;
  if (fixture.contains("targets")) {
    Tensor t = fixture.view("targets");
    peft_targets = split(std::string(t.data<uint8_t>(), t.data<uint8_t>() + t.numel()));
  }
  const bool head = std::find(peft_targets.begin(), peft_targets.end(), "lm_head") != peft_targets.end();

  auto decoder = model::Decoder::from_pretrained(model_dir);
  model::LoraTargets targets;
  targets.attn_modules = {"q_proj", "v_proj", "output_proj"};
  targets.apply_to_mlp = false;
  targets.apply_to_output = head;
  model::LoraOptions options;
  options.rank = 4;
  options.alpha = 8.0f;
  options.use_dora = use_dora;
  if (s.size() >= 8) {
    options.dropout = float(s[6]);
    options.seed = uint64_t(s[7]);
  }
  auto adapters = model::attach_lora(*decoder, targets, options);
  // The fixture targets gate_proj and down_proj but not up_proj: attach those two by hand.
  for (const char* module : {"mlp.gate_proj", "mlp.down_proj"}) {
    for (int layer = 0; layer < 2; ++layer) {
      model::Linear& linear = decoder->linear("model.layers." + std::to_string(layer) + "." + module);
      auto adapter = std::make_shared<model::LoraAdapter>(linear, options);
      linear.adapter = adapter;
      adapters.push_back(adapter);
    }
  }
  decoder->adapters_changed();
  decoder->set_trainable([](const std::string& name) { return name.find("lora_") != std::string::npos; });
  EXPECT_NEAR(adapters.front()->scale(), s[5], 1e-7);

  std::vector<model::Parameter*> params = decoder->parameters();
  std::vector<model::Parameter*> trainable;
  for (model::Parameter* p : params)
    if (p->trainable) trainable.push_back(p);
  size_t expected = 0;
  for (const std::string& name : fixture.names()) expected += name.rfind("init.", 0) == 0;
  ASSERT_EQ(trainable.size(), expected) << "ktune's adapter parameters differ from PEFT's";
  for (model::Parameter* p : trainable) {
    ASSERT_TRUE(fixture.contains("init." + p->name)) << p->name << " is not a PEFT name";
    Tensor init = fixture.to_f32("init." + p->name);
    ASSERT_EQ(init.numel(), p->value.numel()) << p->name;
    std::copy(init.f32(), init.f32() + init.numel(), p->value.f32());
  }

  std::vector<int32_t> tokens = as_i32(fixture.view("tokens")), labels = as_i32(fixture.view("labels"));
  model::Batch batch;
  batch.tokens = tokens.data();
  batch.labels = labels.data();
  batch.B = fixture.view("tokens").shape()[0];
  batch.T = fixture.view("tokens").shape()[1];

  train::AdamW optimizer(trainable, {s[0], s[1], s[2], s[3], s[4]});
  for (int step = 0; fixture.contains("loss." + std::to_string(step)); ++step) {
    for (auto& adapter : adapters) adapter->set_dropout_key(uint64_t(step));  // the fixture's key of step k is k
    decoder->zero_grad();
    int64_t n_valid = 0;
    for (int32_t label : labels) n_valid += label != -100;
    model::LossResult r = decoder->forward_backward(batch, 1.0f / float(n_valid));
    ASSERT_EQ(r.n_valid, n_valid);
    float reference_loss = fixture.to_f32("loss." + std::to_string(step)).f32()[0];
    const double loss = r.loss_sum / double(r.n_valid);
    EXPECT_NEAR(loss, reference_loss, 1e-5 * std::fabs(reference_loss)) << "step " << step;
    worst.loss = std::max(worst.loss, std::fabs(loss - reference_loss) / std::fabs(reference_loss));
    for (model::Parameter* p : trainable) {
      Tensor reference = fixture.to_f32("grad." + std::to_string(step) + "." + p->name);
      const double error = relative_max_error(p->grad.f32(), reference.f32(), reference.numel());
      EXPECT_LT(error, 1e-3) << "gradient of " << p->name << " at step " << step;
      worst.grad = std::max(worst.grad, error);
    }
    optimizer.step(s[0]);
  }
  for (model::Parameter* p : trainable) {
    Tensor reference = fixture.to_f32("final." + p->name);
    const double error = relative_max_error(p->value.f32(), reference.f32(), reference.numel());
    EXPECT_LT(error, 1e-4) << "final " << p->name;
    worst.final_weight = std::max(worst.final_weight, error);
  }
  std::printf("%s: max relative error vs PEFT: loss %.3g, gradients %.3g, final weights %.3g\n", fixture_name.c_str(),
              worst.loss, worst.grad, worst.final_weight);
}

}  // namespace

TEST(PeftSteps, LoraLossesGradientsAndWeightsFollowPytorchAndPeftStepByStep) {
  check_steps("lora.safetensors", false);
}

TEST(PeftSteps, DoraLossesGradientsAndWeightsFollowPytorchAndPeftStepByStep) {
  check_steps("dora.safetensors", true);
}

TEST(PeftSteps, LoraWithDropoutFollowsPeftWithTheSameMask) { check_steps("lora_dropout.safetensors", false); }

TEST(PeftSteps, DoraWithDropoutFollowsPeftWithTheSameMask) { check_steps("dora_dropout.safetensors", true); }

// LoRA on the output projection (PEFT module lm_head) of an untied model, with dropout: the low-rank
// term runs inside the fused chunked loss, never materialising the logits.
TEST(PeftSteps, LoraOnTheOutputLayerWithDropoutFollowsPeft) {
  check_steps("lora_head_dropout.safetensors", false, kUntiedModel);
}

TEST(PeftSteps, DoraOnTheOutputLayerFollowsPeft) { check_steps("dora_head.safetensors", true, kUntiedModel); }

// DoRA with dropout on lm_head: PEFT's (c − 1) ⊙ x' Wᵀ base term inside the fused loss.
TEST(PeftSteps, DoraOnTheOutputLayerWithDropoutFollowsPeft) {
  check_steps("dora_head_dropout.safetensors", true, kUntiedModel);
}

namespace {

double max_relative_difference(const Tensor& a, const Tensor& b) {
  double diff = 0, scale = 1e-12;
  for (int64_t i = 0; i < b.numel(); ++i) {
    diff = std::max(diff, double(std::fabs(a.f32()[i] - b.f32()[i])));
    scale = std::max(scale, double(std::fabs(b.f32()[i])));
  }
  return diff / scale;
}

}  // namespace

TEST(PeftSteps, QloraOnTheOutputLayerEqualsLoraOnItsDequantisedHead) {
  // QLoRA keeps lm_head only in NF4, dequantised a block of rows at a time inside the fused loss; the
  // same steps with LoRA over a model whose head is that dequantised weight must agree.
  model::LoraOptions options{.rank = 4, .alpha = 8.0f, .dropout = 0.2f, .seed = 5};
  std::vector<std::shared_ptr<model::LoraAdapter>> lora_adapters, qlora_adapters;
  options.quantize_base = true;
  auto qlora = model::Decoder::from_pretrained(kUntiedModel);
  qlora_adapters = model::attach_lora(*qlora, {{}, false, true}, options);  // lm_head only
  ASSERT_EQ(qlora_adapters.size(), 1u);
  // The LoRA model: the same adapter on a head replaced by the NF4 round trip, nothing else adapted.
  auto lora = model::Decoder::from_pretrained(kUntiedModel);
  options.quantize_base = false;
  lora_adapters = model::attach_lora(*lora, {{}, false, true}, options);
  Tensor dequantised = qlora_adapters[0]->base_weight(qlora->linear("lm_head"));
  lora->parameter("lm_head.weight").value.copy_from(dequantised);
  EXPECT_FALSE(qlora->parameter("lm_head.weight").value.defined());
  EXPECT_LT(qlora_adapters[0]->base_weight_bytes(qlora->linear("lm_head")),
            lora_adapters[0]->base_weight_bytes(lora->linear("lm_head")) / 6);
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 0.1f);
  Tensor& b_init = qlora_adapters[0]->parameters()[1]->value;  // B non-zero, the same on both
  for (int64_t j = 0; j < b_init.numel(); ++j) b_init.f32()[j] = normal(rng);
  lora_adapters[0]->parameters()[1]->value.copy_from(b_init);
  lora_adapters[0]->parameters()[0]->value.copy_from(qlora_adapters[0]->parameters()[0]->value);

  io::SafetensorsFile fixture = io::SafetensorsFile::open(kDir + "lora_head_dropout.safetensors");
  std::vector<int32_t> tokens = as_i32(fixture.view("tokens")), labels = as_i32(fixture.view("labels"));
  model::Batch batch{tokens.data(), labels.data(), nullptr, nullptr, 2, 16};
  double worst = 0;
  for (int step = 0; step < 2; ++step) {
    model::LossResult a{}, b{};
    for (auto* pair : {&lora_adapters, &qlora_adapters}) (*pair)[0]->set_dropout_key(uint64_t(step));
    lora->zero_grad();
    qlora->zero_grad();
    a = lora->forward_backward(batch, 0.1f);
    b = qlora->forward_backward(batch, 0.1f);
    EXPECT_NEAR(a.loss_sum, b.loss_sum, 1e-5 * std::fabs(a.loss_sum)) << "step " << step;
    for (size_t i = 0; i < 2; ++i) {
      const Tensor& ga = lora_adapters[0]->parameters()[i]->grad;
      const Tensor& gb = qlora_adapters[0]->parameters()[i]->grad;
      const double error = relative_max_error(gb.f32(), ga.f32(), ga.numel());
      EXPECT_LT(error, 1e-5) << lora_adapters[0]->parameters()[i]->name << " step " << step;
      worst = std::max(worst, error);
    }
    // logits (generation) from the NF4 head
    Tensor la = lora->forward_logits(batch), lb = qlora->forward_logits(batch);
    EXPECT_LT(max_relative_difference(lb, la), 1e-5) << "step " << step;
  }
  std::printf("QLoRA on lm_head vs LoRA on its dequantised head: max relative gradient error %.3g\n", worst);
}

TEST(PeftSteps, LoraOnATiedOutputLayerIsRefusedAsTorchtuneDoes) {
  auto decoder = model::Decoder::from_pretrained(kModel);  // tie_word_embeddings: true
  try {
    model::attach_lora(*decoder, {{"q_proj"}, false, true}, {});
    FAIL() << "LoRA on a tied output layer was not refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("apply_lora_to_output"), std::string::npos) << e.what();
  }
}
