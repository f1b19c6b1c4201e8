// Generation (model/generation.h). Greedy: against HF transformers' generate(do_sample=False) on the
// llama parity fixture: tests/model/fixtures/make_greedy_fixture.py wrote, for a few prompts, the
// tokens HF chose (no echo of the prompt's last token, at least four distinct ones, every choice
// ahead of the runner-up by more than 1e-3) and the stop token of the cases that stop early.
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

nlohmann::json greedy_reference() {
  std::ifstream in(kFixture + "/greedy.json");
  EXPECT_TRUE(in.good()) << kFixture << "/greedy.json";
  return nlohmann::json::parse(in);
}

TEST(Generation, ContinuesPromptsAsTransformersGenerateDoes) {
  auto decoder = Decoder::from_pretrained(kFixture);
  const nlohmann::json reference = greedy_reference();
  const int max_new_tokens = reference.at("max_new_tokens").get<int>();
  ASSERT_EQ(reference.at("cases").size(), 3u);
  for (const auto& c : reference.at("cases")) {
    const auto prompt = c.at("prompt").get<std::vector<int32_t>>();
    const auto expected = c.at("continuation").get<std::vector<int32_t>>();
    const int32_t stop = c.at("stop").is_null() ? -1 : c.at("stop").get<int32_t>();
    auto got = generate(*decoder, prompt, max_new_tokens, TokenChoice{}, [&](int32_t id) { return id == stop; }).tokens;
    EXPECT_EQ(got, expected) << "prompt " << c.at("prompt").dump();
  }
}

TEST(Generation, StopsAtTheLimitAndRefusesAnEmptyPrompt) {
  auto decoder = Decoder::from_pretrained(kFixture);
  const nlohmann::json reference = greedy_reference();
  const auto& first = reference.at("cases").at(0);
  const auto prompt = first.at("prompt").get<std::vector<int32_t>>();
  const auto expected = first.at("continuation").get<std::vector<int32_t>>();
  auto never = [](int32_t) { return false; };
  EXPECT_EQ(generate(*decoder, prompt, 3, TokenChoice{}, never).tokens, std::vector<int32_t>(expected.begin(), expected.begin() + 3));
  EXPECT_TRUE(generate(*decoder, prompt, 0, TokenChoice{}, never).tokens.empty());
  EXPECT_THROW(generate(*decoder, {}, 4, TokenChoice{}, never), Error);
}

TEST(Generation, ASampledAnswerFollowsItsSeedAndTopKOneIsTheGreedyOne) {
  auto decoder = Decoder::from_pretrained(kFixture);
  const nlohmann::json reference = greedy_reference();
  const auto& first = reference.at("cases").at(0);
  const auto prompt = first.at("prompt").get<std::vector<int32_t>>();
  const auto greedy = first.at("continuation").get<std::vector<int32_t>>();
  const int n = int(greedy.size());
  auto never = [](int32_t) { return false; };
  const TokenChoice hot{2.0f, 0, 1.0f, 3};
  const auto sampled = generate(*decoder, prompt, n, hot, never).tokens;
  EXPECT_EQ(generate(*decoder, prompt, n, hot, never).tokens, sampled);
  EXPECT_NE(sampled, greedy);  // at temperature 2 the fixture's small model is far from greedy
  EXPECT_NE(generate(*decoder, prompt, n, TokenChoice{2.0f, 0, 1.0f, 4}, never).tokens, sampled);
  EXPECT_EQ(generate(*decoder, prompt, n, TokenChoice{2.0f, 1, 1.0f, 3}, never).tokens, greedy);
  EXPECT_THROW(generate(*decoder, prompt, n, TokenChoice{1.0f, 0, 0.0f, 3}, never), Error);
}

}  // namespace
}  // namespace ktune::model
