// Beam search (model/beam_search.h) against transformers' generate(num_beams=N, do_sample=False) on
// the llama parity fixture: tests/model/fixtures/make_beam_fixture.py wrote, for six settings
// (2-4 beams; length_penalty 0.5, 1, 2; early_stopping on and off; with and without a stop token;
// one with no_repeat_ngram_size 2), a prompt whose beams' answer differs from greedy decoding's, the
// answer and HF's score for it; and one (length_penalty 2) where HF's early-stop heuristic ended the
// search before the limit with another answer than a search to the limit gives.
#include "model/beam_search.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/decoder.h"
#include "model/generation.h"

namespace ktune::model {
namespace {

const std::string kFixture = std::string(KTUNE_SOURCE_DIR) + "/tests/model/fixtures/llama";

nlohmann::json beam_reference() {
  std::ifstream in(kFixture + "/beam.json");
  EXPECT_TRUE(in.good()) << kFixture << "/beam.json";
  return nlohmann::json::parse(in);
}

std::vector<int32_t> stops_of(const nlohmann::json& c) {
  return c.at("stop").is_null() ? std::vector<int32_t>{} : std::vector<int32_t>{c.at("stop").get<int32_t>()};
}

TEST(BeamSearch, AnswersAsTransformersBeamSearchDoes) {
  auto decoder = Decoder::from_pretrained(kFixture);
  const nlohmann::json reference = beam_reference();
  const int max_new_tokens = reference.at("max_new_tokens").get<int>();
  ASSERT_EQ(reference.at("cases").size(), 7u);
  for (const auto& c : reference.at("cases")) {
    BeamOptions beams;
    beams.num_beams = c.at("num_beams").get<int>();
    beams.length_penalty = c.at("length_penalty").get<float>();
    beams.early_stopping = c.at("early_stopping").get<bool>();
    TokenChoice choice;
    choice.no_repeat_ngram_size = c.at("no_repeat_ngram_size").get<int64_t>();
    const BeamAnswer got =
        beam_search(*decoder, c.at("prompt").get<std::vector<int32_t>>(), max_new_tokens, beams, choice, stops_of(c));
    EXPECT_EQ(got.tokens, c.at("continuation").get<std::vector<int32_t>>()) << c.dump();
    EXPECT_NEAR(got.score, c.at("score").get<float>(), 1e-4) << c.dump();
  }
}

// One beam is greedy decoding; a search's answer is never less likely (by its score) than the
// greedy answer's own sum of log-probabilities over its length, at length_penalty 1 without stops.
TEST(BeamSearch, OneBeamIsGreedyDecoding) {
  auto decoder = Decoder::from_pretrained(kFixture);
  const nlohmann::json reference = beam_reference();
  const int max_new_tokens = reference.at("max_new_tokens").get<int>();
  for (const auto& c : reference.at("cases")) {
    const auto prompt = c.at("prompt").get<std::vector<int32_t>>();
    const std::vector<int32_t> stops = stops_of(c);
    BeamOptions one;
    const BeamAnswer beam = beam_search(*decoder, prompt, max_new_tokens, one, TokenChoice{}, stops);
    const std::vector<int32_t> greedy = generate(*decoder, prompt, max_new_tokens, TokenChoice{}, [&](int32_t id) {
      return !stops.empty() && id == stops[0];
    });
    EXPECT_EQ(beam.tokens, greedy) << c.dump();
  }
}

TEST(BeamSearch, RefusesWhatItCannotDo) {
  auto decoder = Decoder::from_pretrained(kFixture);
  BeamOptions beams;
  beams.num_beams = 2;
  TokenChoice sampled;
  sampled.temperature = 0.7f;
  EXPECT_THROW(beam_search(*decoder, {1, 2}, 4, beams, sampled, {}), Error);
  EXPECT_THROW(beam_search(*decoder, {}, 4, beams, TokenChoice{}, {}), Error);
  BeamOptions none;
  none.num_beams = 0;
  EXPECT_THROW(beam_search(*decoder, {1, 2}, 4, none, TokenChoice{}, {}), Error);
  EXPECT_TRUE(beam_search(*decoder, {1, 2}, 0, beams, TokenChoice{}, {}).tokens.empty());
}

}  // namespace
}  // namespace ktune::model
