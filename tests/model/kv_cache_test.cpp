// Decoder::forward_cached (generation against a KV cache) against forward_logits over the whole
// sequence, which the parity tests hold to HF transformers: the prompt in one call, then a few
// tokens, then one a call, must give the logits the full forward gives at those positions, for
// every family's fixture (Gemma2's and Mistral's have sliding windows shorter than the sequence,
// Gemma2 soft-caps), bf16 weights, a PEFT LoRA adapter on an untied head, and a second sequence
// after clear(); several sequences stepping together, as each alone. Also what it refuses: a full
// cache, another model's cache, one cache twice in a pass.
#include "model/kv_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/adapters/peft_adapter_dir.h"
#include "model/decoder.h"

namespace ktune::model {
namespace {

const std::string kSource = KTUNE_SOURCE_DIR;
const std::string kFixtures = kSource + "/tests/model/fixtures/";

std::vector<int32_t> some_tokens(int64_t T, int64_t V, uint32_t seed) {
  std::vector<int32_t> tokens(static_cast<size_t>(T));
  uint32_t x = seed;
  for (auto& t : tokens) {
    x = x * 1664525u + 1013904223u;
    t = int32_t((x >> 8) % uint32_t(V));
  }
  return tokens;
}

// Feeds `tokens` in pieces of the given sizes and checks each piece's last logits against the full
// forward's row at that position (max |diff| within 1e-4 of the row's largest |logit|, at least 1e-5).
void expect_cached_logits_match(Decoder& decoder, KvCache& cache, const std::vector<int32_t>& tokens,
                                const std::vector<int64_t>& pieces, const std::string& what) {
  const int64_t T = int64_t(tokens.size()), V = decoder.config().vocab_size;
  const Batch batch{tokens.data(), nullptr, nullptr, nullptr, 1, T};
  Tensor full = decoder.forward_logits(batch);  // (1, T, V)
  std::vector<float> logits(static_cast<size_t>(V));
  int64_t fed = 0;
  for (int64_t piece : pieces) {
    decoder.forward_cached(tokens.data() + fed, piece, cache, logits.data());
    fed += piece;
    ASSERT_EQ(cache.length(), fed) << what;
    const float* expected = full.f32() + (fed - 1) * V;
    float error = 0, scale = 0;
    for (int64_t v = 0; v < V; ++v) {
      error = std::max(error, std::fabs(logits[size_t(v)] - expected[v]));
      scale = std::max(scale, std::fabs(expected[v]));
    }
    EXPECT_LE(error, std::max(1e-4f * scale, 1e-5f)) << what << ": position " << fed - 1;
  }
}

// A prompt of 9, then 3 tokens, then one at a time up to 24 tokens.
std::vector<int64_t> prompt_then_steps() {
  std::vector<int64_t> pieces = {9, 3};
  while (pieces.size() < 2 + 12) pieces.push_back(1);
  return pieces;
}

class KvCacheFamily : public ::testing::TestWithParam<const char*> {};

TEST_P(KvCacheFamily, TokenByTokenGivesTheFullForwardsLogits) {
  auto decoder = Decoder::from_pretrained(kFixtures + GetParam());
  const auto tokens = some_tokens(24, decoder->config().vocab_size, 7);
  KvCache cache(decoder->config(), 24);
  expect_cached_logits_match(*decoder, cache, tokens, prompt_then_steps(), GetParam());
  // A second sequence in the same cache, after clear(), and the whole of it at once.
  cache.clear();
  const auto other = some_tokens(17, decoder->config().vocab_size, 8);
  expect_cached_logits_match(*decoder, cache, other, {17}, std::string(GetParam()) + ", second sequence");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, KvCacheFamily, ::testing::Values("llama", "qwen2", "mistral", "gemma2"));

TEST(KvCache, Bf16WeightsGiveTheirFullForwardsLogits) {
  for (const char* family : {"llama", "gemma2"}) {
    LoadOptions options;
    options.storage = DType::BF16;
    auto decoder = Decoder::from_pretrained(kFixtures + family, options);
    KvCache cache(decoder->config(), 24);
    expect_cached_logits_match(*decoder, cache, some_tokens(24, decoder->config().vocab_size, 9), prompt_then_steps(),
                               std::string(family) + " bf16");
  }
}

TEST(KvCache, ALoraAdapterOnTheUntiedHeadCountsInTheCachedLogits) {
  const std::string dir = kFixtures + "peft/lora_head";
  std::ifstream config(dir + "/adapter_config.json");
  const std::string base = kSource + "/" + nlohmann::json::parse(config).at("base_model_name_or_path").get<std::string>();
  auto decoder = Decoder::from_pretrained(base);
  load_peft_adapter(*decoder, dir);
  KvCache cache(decoder->config(), 24);
  expect_cached_logits_match(*decoder, cache, some_tokens(24, decoder->config().vocab_size, 10), prompt_then_steps(),
                             "LoRA on lm_head");
}

// Three sequences of different lengths, each prompt alone, then steps that feed a token of each
// together (one pass), and steps of two: every sequence's logits are its own full forward's.
TEST(KvCache, SequencesStepTogetherAsEachAlone) {
  for (const char* family : {"llama", "gemma2"}) {
    auto decoder = Decoder::from_pretrained(kFixtures + family);
    const int64_t V = decoder->config().vocab_size;
    const std::vector<int64_t> prompt_lengths = {3, 11, 7};
    const int64_t steps = 8;
    std::vector<std::vector<int32_t>> sequences;
    std::vector<Tensor> full;
    std::vector<KvCache> caches;
    std::vector<float> logits(static_cast<size_t>(3 * V));
    for (size_t i = 0; i < 3; ++i) {
      sequences.push_back(some_tokens(prompt_lengths[i] + steps, V, uint32_t(20 + i)));
      const Batch batch{sequences[i].data(), nullptr, nullptr, nullptr, 1, int64_t(sequences[i].size())};
      full.push_back(decoder->forward_logits(batch));
      caches.emplace_back(decoder->config(), prompt_lengths[i] + steps);
      decoder->forward_cached(sequences[i].data(), prompt_lengths[i], caches[i], logits.data() + i * size_t(V));
    }
    auto expect_row = [&](size_t i, const float* got, int64_t position) {
      const float* expected = full[i].f32() + position * V;
      float error = 0, scale = 0;
      for (int64_t v = 0; v < V; ++v) {
        error = std::max(error, std::fabs(got[v] - expected[v]));
        scale = std::max(scale, std::fabs(expected[v]));
      }
      EXPECT_LE(error, std::max(1e-4f * scale, 1e-5f)) << family << " sequence " << i << " position " << position;
    };
    for (size_t i = 0; i < 3; ++i) expect_row(i, logits.data() + i * size_t(V), prompt_lengths[i] - 1);
    for (int64_t step = 0; step < steps; ++step) {
      // All three for the first half of the steps, then the first and the last only.
      std::vector<size_t> fed = step < steps / 2 ? std::vector<size_t>{0, 1, 2} : std::vector<size_t>{0, 2};
      std::vector<int32_t> tokens;
      std::vector<CachedSequence> batch;
      for (size_t i : fed) {
        tokens.push_back(sequences[i][size_t(caches[i].length())]);
        batch.push_back({&caches[i], 1});
      }
      std::vector<float> step_logits(fed.size() * size_t(V));
      decoder->forward_cached(tokens.data(), batch, step_logits.data());
      for (size_t b = 0; b < fed.size(); ++b)
        expect_row(fed[b], step_logits.data() + b * size_t(V), caches[fed[b]].length() - 1);
    }
    // Two tokens of one and one of another in a pass: the logits of each one's last.
    std::vector<KvCache> more;
    more.emplace_back(decoder->config(), 8);
    more.emplace_back(decoder->config(), 8);
    decoder->forward_cached(sequences[0].data(), 2, more[0], logits.data());
    decoder->forward_cached(sequences[1].data(), 3, more[1], logits.data());
    const std::vector<int32_t> tokens = {sequences[0][2], sequences[0][3], sequences[1][3]};
    std::vector<float> two(static_cast<size_t>(2 * V));
    decoder->forward_cached(tokens.data(), {{&more[0], 2}, {&more[1], 1}}, two.data());
    expect_row(0, two.data(), 3);
    expect_row(1, two.data() + V, 3);
  }
}

TEST(KvCache, RefusesTokensPastItsCapacityAndAnotherModelsShape) {
  auto llama = Decoder::from_pretrained(kFixtures + "llama");
  const auto tokens = some_tokens(8, llama->config().vocab_size, 11);
  std::vector<float> logits(static_cast<size_t>(llama->config().vocab_size));
  KvCache cache(llama->config(), 6);
  llama->forward_cached(tokens.data(), 5, cache, logits.data());
  EXPECT_THROW(llama->forward_cached(tokens.data() + 5, 2, cache, logits.data()), Error);
  EXPECT_EQ(cache.length(), 5);  // nothing of the refused call was kept
  llama->forward_cached(tokens.data() + 5, 1, cache, logits.data());
  EXPECT_EQ(cache.length(), 6);

  auto gemma = Decoder::from_pretrained(kFixtures + "gemma2");
  KvCache gemma_cache(gemma->config(), 8);
  EXPECT_THROW(llama->forward_cached(tokens.data(), 1, gemma_cache, logits.data()), Error);
  EXPECT_THROW(KvCache(llama->config(), 0), Error);
  KvCache other(llama->config(), 6);
  EXPECT_THROW(llama->forward_cached(tokens.data(), {{&other, 1}, {&other, 1}}, logits.data()), Error);  // one cache twice
  EXPECT_THROW(llama->forward_cached(tokens.data(), {{&other, 0}}, logits.data()), Error);
  EXPECT_THROW(llama->forward_cached(tokens.data(), std::vector<CachedSequence>{}, logits.data()), Error);
  EXPECT_EQ(other.length(), 0);
}

// A cache copied from another (a beam continuing its parent, model/beam_search.h) continues as the
// original does; one too small, or of another model, is refused.
TEST(KvCache, ACopyContinuesAsItsOriginal) {
  auto llama = Decoder::from_pretrained(kFixtures + "llama");
  const int64_t V = llama->config().vocab_size;
  const auto tokens = some_tokens(7, V, 5);
  std::vector<float> original(static_cast<size_t>(V)), copied(static_cast<size_t>(V));
  KvCache cache(llama->config(), 8), copy(llama->config(), 8);
  llama->forward_cached(tokens.data(), 5, cache, original.data());
  copy.copy_from(cache);
  EXPECT_EQ(copy.length(), 5);
  llama->forward_cached(tokens.data() + 5, 2, cache, original.data());
  llama->forward_cached(tokens.data() + 5, 2, copy, copied.data());
  EXPECT_EQ(copied, original);  // the same rows, the same arithmetic

  KvCache small(llama->config(), 4);
  EXPECT_THROW(small.copy_from(cache), Error);
  auto gemma = Decoder::from_pretrained(kFixtures + "gemma2");
  KvCache gemma_cache(gemma->config(), 8);
  EXPECT_THROW(gemma_cache.copy_from(cache), Error);
}

}  // namespace
}  // namespace ktune::model
