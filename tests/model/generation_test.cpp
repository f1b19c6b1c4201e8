// Generation (model/generation.h). Greedy: against HF transformers' generate(do_sample=False) on the
// llama parity fixture: tests/model/fixtures/make_greedy_fixture.py wrote, for a few prompts, the
// tokens HF chose (no echo of the prompt's last token, at least four distinct ones, every choice
// ahead of the runner-up by more than 1e-3) and the stop token of the cases that stop early.
#include <gtest/gtest.h>

#include <fstream>
#include <set>
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
    auto got = generate(*decoder, prompt, max_new_tokens, TokenChoice{}, [&](int32_t id) { return id == stop; });
    EXPECT_EQ(got, expected) << "prompt " << c.at("prompt").dump();
  }
}

// The same prompts with transformers' repetition_penalty (over the prompt and the answer so far):
// continuations the penalty changed, each answered alone and all three together.
TEST(Generation, ARepetitionPenaltyContinuesAsTransformersGenerateDoes) {
  auto decoder = Decoder::from_pretrained(kFixture);
  const nlohmann::json reference = greedy_reference();
  const int max_new_tokens = reference.at("max_new_tokens").get<int>();
  const nlohmann::json& cases = reference.at("repetition");
  ASSERT_EQ(cases.size(), 3u);
  for (const auto& c : cases) {
    TokenChoice choice;
    choice.repetition_penalty = c.at("penalty").get<float>();
    const auto prompt = c.at("prompt").get<std::vector<int32_t>>();
    EXPECT_EQ(generate(*decoder, prompt, max_new_tokens, choice, [](int32_t) { return false; }),
              c.at("continuation").get<std::vector<int32_t>>())
        << "prompt " << c.at("prompt").dump() << ", penalty " << choice.repetition_penalty;
  }
  TokenChoice choice;
  choice.repetition_penalty = cases.at(0).at("penalty").get<float>();
  for (const auto& c : cases) ASSERT_EQ(c.at("penalty").get<float>(), choice.repetition_penalty);
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& c : cases) prompts.push_back(c.at("prompt").get<std::vector<int32_t>>());
  const Generated together = generate(*decoder, prompts, max_new_tokens, choice, [](int32_t) { return false; });
  for (size_t i = 0; i < cases.size(); ++i)
    EXPECT_EQ(together.answers[i], cases.at(i).at("continuation").get<std::vector<int32_t>>()) << "together, prompt " << i;
}

// transformers' no_repeat_ngram_size 2 and 3 (over the prompt and the answer so far) on prompts that
// repeat part of themselves: continuations the ban changed, each answered alone and all together.
TEST(Generation, NoRepeatedNgramsContinuesAsTransformersGenerateDoes) {
  auto decoder = Decoder::from_pretrained(kFixture);
  const nlohmann::json reference = greedy_reference();
  const int max_new_tokens = reference.at("max_new_tokens").get<int>();
  const nlohmann::json& cases = reference.at("no_repeat_ngram");
  ASSERT_EQ(cases.size(), 4u);
  for (int64_t n : {2, 3}) {
    TokenChoice choice;
    choice.no_repeat_ngram_size = n;
    std::vector<std::vector<int32_t>> prompts, expected;
    for (const auto& c : cases) {
      if (c.at("ngram_size").get<int64_t>() != n) continue;
      prompts.push_back(c.at("prompt").get<std::vector<int32_t>>());
      expected.push_back(c.at("continuation").get<std::vector<int32_t>>());
      EXPECT_EQ(generate(*decoder, prompts.back(), max_new_tokens, choice, [](int32_t) { return false; }), expected.back())
          << "prompt " << c.at("prompt").dump() << ", no_repeat_ngram_size " << n;
    }
    ASSERT_EQ(prompts.size(), 2u);
    const Generated together = generate(*decoder, prompts, max_new_tokens, choice, [](int32_t) { return false; });
    EXPECT_EQ(together.answers, expected) << "together, no_repeat_ngram_size " << n;
  }
}

TEST(Generation, StopsAtTheLimitAndRefusesAnEmptyPrompt) {
  auto decoder = Decoder::from_pretrained(kFixture);
  const nlohmann::json reference = greedy_reference();
  const auto& first = reference.at("cases").at(0);
  const auto prompt = first.at("prompt").get<std::vector<int32_t>>();
  const auto expected = first.at("continuation").get<std::vector<int32_t>>();
  auto never = [](int32_t) { return false; };
  EXPECT_EQ(generate(*decoder, prompt, 3, TokenChoice{}, never), std::vector<int32_t>(expected.begin(), expected.begin() + 3));
  EXPECT_TRUE(generate(*decoder, prompt, 0, TokenChoice{}, never).empty());
  EXPECT_THROW(generate(*decoder, std::vector<int32_t>{}, 4, TokenChoice{}, never), Error);
}

// The three prompts answered together (their steps batched, the answers that stop leaving the
// batch) give what transformers gave each alone; so does each again with its sampled answer.
TEST(Generation, PromptsAnsweredTogetherAnswerAsEachAlone) {
  auto decoder = Decoder::from_pretrained(kFixture);
  const nlohmann::json reference = greedy_reference();
  const int max_new_tokens = reference.at("max_new_tokens").get<int>();
  std::vector<std::vector<int32_t>> prompts, expected;
  std::set<int32_t> stops;
  for (const auto& c : reference.at("cases")) {
    prompts.push_back(c.at("prompt").get<std::vector<int32_t>>());
    expected.push_back(c.at("continuation").get<std::vector<int32_t>>());
    if (!c.at("stop").is_null()) stops.insert(c.at("stop").get<int32_t>());
  }
  for (const auto& continuation : expected)  // one stop set serves all: no answer holds another's stop
    for (int32_t id : continuation) ASSERT_EQ(stops.count(id), 0u);
  auto is_stop = [&](int32_t id) { return stops.count(id) > 0; };
  const Generated together = generate(*decoder, prompts, max_new_tokens, TokenChoice{}, is_stop);
  EXPECT_EQ(together.answers, expected);
  // The first new tokens come with the prompts' passes; the steps after feed the unfinished ones.
  EXPECT_EQ(together.steps, max_new_tokens - 1);
  // The first answer feeds all but its last token; the two that stop feed both of theirs.
  EXPECT_EQ(together.step_tokens, (max_new_tokens - 1) + 2 + 2);
  EXPECT_EQ(together.prompt_tokens, 5 + 11 + 11);

  const TokenChoice hot{1.5f, 0, 1.0f, 11};
  const Generated sampled = generate(*decoder, prompts, max_new_tokens, hot, is_stop);
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(sampled.answers[i], generate(*decoder, prompts[i], max_new_tokens, hot, is_stop)) << "prompt " << i;
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
  const auto sampled = generate(*decoder, prompt, n, hot, never);
  EXPECT_EQ(generate(*decoder, prompt, n, hot, never), sampled);
  EXPECT_NE(sampled, greedy);  // at temperature 2 the fixture's small model is far from greedy
  EXPECT_NE(generate(*decoder, prompt, n, TokenChoice{2.0f, 0, 1.0f, 4}, never), sampled);
  EXPECT_EQ(generate(*decoder, prompt, n, TokenChoice{2.0f, 1, 1.0f, 3}, never), greedy);
  EXPECT_THROW(generate(*decoder, prompt, n, TokenChoice{1.0f, 0, 0.0f, 3}, never), Error);
}

}  // namespace
}  // namespace ktune::model
