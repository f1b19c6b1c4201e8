// Greedy decoding (model/greedy_decode.h) against HF transformers' generate(do_sample=False) on the
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
#include "model/greedy_decode.h"

namespace ktune::model {
namespace {

const std::string kFixture = std::string(KTUNE_SOURCE_DIR) + "/tests/model/fixtures/llama";

nlohmann::json greedy_reference() {
  std::ifstream in(kFixture + "/greedy.json");
  EXPECT_TRUE(in.good()) << kFixture << "/greedy.json";
  return nlohmann::json::parse(in);
}

TEST(GreedyDecode, ContinuesPromptsAsTransformersGenerateDoes) {
  auto decoder = Decoder::from_pretrained(kFixture);
  const nlohmann::json reference = greedy_reference();
  const int max_new_tokens = reference.at("max_new_tokens").get<int>();
  ASSERT_EQ(reference.at("cases").size(), 3u);
  for (const auto& c : reference.at("cases")) {
    const auto prompt = c.at("prompt").get<std::vector<int32_t>>();
    const auto expected = c.at("continuation").get<std::vector<int32_t>>();
    const int32_t stop = c.at("stop").is_null() ? -1 : c.at("stop").get<int32_t>();
    auto got = greedy_decode(*decoder, prompt, max_new_tokens, [&](int32_t id) { return id == stop; });
    EXPECT_EQ(got, expected) << "prompt " << c.at("prompt").dump();
  }
}

TEST(GreedyDecode, StopsAtTheLimitAndRefusesAnEmptyPrompt) {
  auto decoder = Decoder::from_pretrained(kFixture);
  const nlohmann::json reference = greedy_reference();
  const auto& first = reference.at("cases").at(0);
  const auto prompt = first.at("prompt").get<std::vector<int32_t>>();
  const auto expected = first.at("continuation").get<std::vector<int32_t>>();
  auto never = [](int32_t) { return false; };
  EXPECT_EQ(greedy_decode(*decoder, prompt, 3, never), std::vector<int32_t>(expected.begin(), expected.begin() + 3));
  EXPECT_TRUE(greedy_decode(*decoder, prompt, 0, never).empty());
  EXPECT_THROW(greedy_decode(*decoder, {}, 4, never), Error);
}

}  // namespace
}  // namespace ktune::model
