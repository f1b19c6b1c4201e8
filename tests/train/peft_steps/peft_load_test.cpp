// An adapter with LoRA/DoRA on the output layer (lm_head), saved by ktune's checkpointer, loads the
// way users load it — PeftModel.from_pretrained over the base model (tests/train/recipes/
// hf_peft_logits.py) — and gives ktune's logits; the merged model, read by transformers, too.
// Labelled slow: each variant starts Python with torch, transformers and peft.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/adapters/lora_adapter.h"
#include "model/decoder.h"
#include "train/checkpointer.h"

using namespace ktune;

namespace {

const std::string kUntiedModel = std::string(KTUNE_SOURCE_DIR) + "/tests/train/peft_steps/untied_llama";

// An untied model with LoRA (or DoRA) on attention and on lm_head, B made non-zero.
std::unique_ptr<model::Decoder> adapted_untied_model(const model::LoraOptions& options,
                                                     std::vector<std::shared_ptr<model::LoraAdapter>>* adapters) {
  auto decoder = model::Decoder::from_pretrained(kUntiedModel);
  model::LoraTargets targets{{"q_proj", "v_proj"}, false, true};
  *adapters = model::attach_lora(*decoder, targets, options);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 0.1f);
  for (auto& a : *adapters)
    for (model::Parameter* p : a->parameters())
      if (p->name.find("lora_B") != std::string::npos)
        for (int64_t i = 0; i < p->value.numel(); ++i) p->value.f32()[i] = normal(rng);
  return decoder;
}

double max_relative_difference(const Tensor& a, const Tensor& b) {
  double diff = 0, scale = 1e-12;
  for (int64_t i = 0; i < b.numel(); ++i) {
    diff = std::max(diff, double(std::fabs(a.f32()[i] - b.f32()[i])));
    scale = std::max(scale, double(std::fabs(b.f32()[i])));
  }
  return diff / scale;
}


}  // namespace

TEST(PeftSteps, AnOutputLayerAdapterLoadsInPeftAndTheMergedModelInTransformersWithOurLogits) {
  namespace fs = std::filesystem;
  const char* tmp = std::getenv("TMPDIR");
  const fs::path dir = fs::path(tmp ? tmp : "/tmp") / ("ktune_peft_head_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  for (bool dora : {false, true}) {
    model::LoraOptions options{.rank = 4, .alpha = 8.0f, .dropout = dora ? 0.0f : 0.1f, .use_dora = dora};
    std::vector<std::shared_ptr<model::LoraAdapter>> adapters;
    auto decoder = adapted_untied_model(options, &adapters);
    ASSERT_EQ(adapters.back()->module_name(), "lm_head");
    for (auto& a : adapters) a->set_training(false);  // evaluation: no dropout, as PEFT's eval()

    train::HfCheckpointer checkpointer(kUntiedModel, {"model.safetensors"}, dir.string());
    train::SaveRequest request;
    request.name = dora ? "dora" : "lora";
    request.decoder = decoder.get();
    request.adapters = adapters;
    request.adapter = train::AdapterDescription{options, model::lora_target_modules({{"q_proj", "v_proj"}, false, true})};
    request.weights_dtype = DType::F32;
    request.recipe_state = nlohmann::json::object();
    const std::string ckpt = checkpointer.save(request);
    {
      std::ifstream config(ckpt + "/adapter_config.json");
      std::stringstream text;
      text << config.rdbuf();
      EXPECT_NE(text.str().find("\"lm_head\""), std::string::npos) << "target_modules lacks lm_head: " << text.str();
      io::SafetensorsFile adapter = io::SafetensorsFile::open(ckpt + "/adapter_model.safetensors");
      EXPECT_TRUE(adapter.contains("base_model.model.lm_head.lora_A.weight"));
      EXPECT_TRUE(adapter.contains("base_model.model.lm_head.lora_B.weight"));
      EXPECT_EQ(adapter.contains("base_model.model.lm_head.lora_magnitude_vector"), dora);
    }

    const std::vector<int32_t> ids = {0, 17, 42, 99, 5, 120, 151, 7, 64, 128};
    std::string command = "python3 " + std::string(KTUNE_SOURCE_DIR) + "/tests/train/recipes/hf_peft_logits.py " +
                          kUntiedModel + " " + ckpt + " " + (dir / "logits.safetensors").string();
    for (int32_t id : ids) command += " " + std::to_string(id);
    command += " > " + (dir / "python.log").string() + " 2>&1";
    const int status = std::system(command.c_str());
    std::ifstream log_file(dir / "python.log");
    std::stringstream log;
    log << log_file.rdbuf();
    if (WIFEXITED(status) && WEXITSTATUS(status) == 3) {
      fs::remove_all(dir);
      GTEST_SKIP() << "torch/transformers/peft not installed: " << log.str();
    }
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << log.str();

    model::Batch batch{ids.data(), nullptr, nullptr, nullptr, 1, int64_t(ids.size())};
    Tensor ours = decoder->forward_logits(batch);  // the adapted model, the head's adapter included
    auto merged = model::Decoder::from_pretrained(ckpt);
    Tensor ours_merged = merged->forward_logits(batch);
    io::SafetensorsFile reference = io::SafetensorsFile::open((dir / "logits.safetensors").string());
    const double peft_error = max_relative_difference(ours, reference.to_f32("peft"));
    const double merged_error = max_relative_difference(ours_merged, reference.to_f32("merged"));
    // Without the head's adapter the logits must be visibly different: the check can fail.
    model::Linear& head = decoder->linear("lm_head");
    auto head_adapter = head.adapter;
    head.adapter = nullptr;
    decoder->adapters_changed();
    const double without_head = max_relative_difference(decoder->forward_logits(batch), reference.to_f32("peft"));
    head.adapter = head_adapter;
    decoder->adapters_changed();
    std::printf("%s on lm_head: max relative logit error vs PEFT %.3g, merged vs transformers %.3g (without the head's "
                "adapter: %.3g)\n", dora ? "DoRA" : "LoRA", peft_error, merged_error, without_head);
    EXPECT_LT(peft_error, 1e-5);
    EXPECT_LT(merged_error, 1e-5);
    EXPECT_GT(without_head, 1e-3);
  }
  fs::remove_all(dir);
}

