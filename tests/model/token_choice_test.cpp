// Choosing a token from logits (model/token_choice.h). The distribution sampled from against HF
// transformers' own warpers (fixtures/make_token_choice_fixture.py: temperature, top-k, top-p, and
// combinations); the draws against that distribution (frequencies over many draws); greedy's ties;
// reproducible draws; and the options refused.
#include "model/token_choice.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace ktune::model {
namespace {

const std::string kFixture = std::string(KTUNE_SOURCE_DIR) + "/tests/model/fixtures/token_choice.json";

nlohmann::json hf_cases() {
  std::ifstream in(kFixture);
  EXPECT_TRUE(in.good()) << kFixture;
  return nlohmann::json::parse(in).at("cases");
}

TokenChoice choice_of(const nlohmann::json& c, uint64_t seed = 0) {
  TokenChoice choice{c.at("temperature").get<float>(), c.at("top_k").get<int64_t>(), c.at("top_p").get<float>(), seed};
  choice.min_p = c.at("min_p").get<float>();
  return choice;
}

TEST(TokenChoice, SamplesFromTheDistributionTransformersWarpersGive) {
  const nlohmann::json cases = hf_cases();
  ASSERT_GE(cases.size(), 16u);  // min_p's from the eleventh
  for (const auto& c : cases) {
    const auto logits = c.at("logits").get<std::vector<float>>();
    const auto expected = c.at("probs").get<std::vector<double>>();
    const auto kept = sampling_distribution(logits.data(), int64_t(logits.size()), choice_of(c));
    std::vector<double> got(logits.size(), 0.0);
    for (const auto& [id, p] : kept) got[size_t(id)] = p;
    for (size_t v = 0; v < logits.size(); ++v)
      EXPECT_NEAR(got[v], expected[v], 1e-5) << "token " << v << " of " << c.dump();
    for (size_t i = 1; i < kept.size(); ++i) EXPECT_GE(kept[i - 1].second, kept[i].second);
  }
}

TEST(TokenChoice, TheRepetitionPenaltyIsTransformersOnTheContextsTokens) {
  std::ifstream in(kFixture);
  const nlohmann::json cases = nlohmann::json::parse(in).at("repetition");
  ASSERT_EQ(cases.size(), 3u);
  for (const auto& c : cases) {
    std::vector<float> logits = c.at("logits").get<std::vector<float>>();
    const auto context = c.at("context").get<std::vector<int32_t>>();
    const auto expected = c.at("penalized").get<std::vector<float>>();
    apply_repetition_penalty(logits.data(), int64_t(logits.size()), context.data(), int64_t(context.size()),
                             c.at("penalty").get<float>());
    EXPECT_EQ(logits, expected) << c.dump();  // one float multiply or divide each: the same bits
  }
  std::vector<float> logits = {1.0f, -1.0f};
  const int32_t outside = 2;
  EXPECT_THROW(apply_repetition_penalty(logits.data(), 2, &outside, 1, 1.5f), Error);
}

// HF's NoRepeatNGramLogitsProcessor, worked by hand: after the context's last n - 1 tokens, every
// token that ended an n-gram starting with them is ruled out (-inf); the others keep their logits.
TEST(TokenChoice, NoRepeatedNgramRulesOutTheTokensThatWouldRepeatOne) {
  auto banned = [](std::vector<int32_t> context, int64_t n) {
    std::vector<float> logits = {0.5f, 1.0f, -2.0f, 3.0f, 0.0f, 7.0f};
    ban_repeated_ngrams(logits.data(), int64_t(logits.size()), context.data(), int64_t(context.size()), n);
    std::vector<int32_t> out;
    for (size_t v = 0; v < logits.size(); ++v) {
      if (logits[v] == -std::numeric_limits<float>::infinity()) out.push_back(int32_t(v));
      else EXPECT_NE(logits[v], -std::numeric_limits<float>::infinity());
    }
    return out;
  };
  using Ids = std::vector<int32_t>;
  EXPECT_EQ(banned({1, 2, 3, 1, 2}, 3), Ids{3});           // (1, 2) was followed by 3
  EXPECT_EQ(banned({1, 2, 3, 1, 2, 4, 1, 2}, 3), (Ids{3, 4}));  // and later by 4
  EXPECT_EQ(banned({1, 2, 3, 1, 2}, 2), Ids{3});           // after 2 came only 3
  EXPECT_EQ(banned({4, 4, 4}, 2), Ids{4});
  EXPECT_EQ(banned({5, 0, 5}, 1), (Ids{0, 5}));            // unigrams: every token of the context
  EXPECT_EQ(banned({1, 2, 3, 1, 2}, 4), Ids{});            // (2, 1, 2) never came before
  EXPECT_EQ(banned({1, 2, 1}, 5), Ids{});                  // shorter than n - 1: nothing to match
  EXPECT_EQ(banned({1, 2, 3}, 0), Ids{});                  // 0: off
  EXPECT_EQ(banned({}, 1), Ids{});
  std::vector<float> logits = {1.0f, 2.0f};
  const std::vector<int32_t> outside = {1, 9, 1};  // bans 9, outside a vocabulary of 2
  EXPECT_THROW(ban_repeated_ngrams(logits.data(), 2, outside.data(), 3, 2), Error);
  TokenChoice negative;
  negative.no_repeat_ngram_size = -1;
  EXPECT_THROW(check_token_choice(negative), Error);
}

TEST(TokenChoice, DrawsFollowTheDistribution) {
  // Over 40000 draws each token's frequency is within 5 standard deviations of its probability, and
  // no token outside the kept set is ever drawn.
  const nlohmann::json cases = hf_cases();
  for (const auto& c : {cases.at(1), cases.at(3), cases.at(5), cases.at(10), cases.at(12)}) {
    const auto logits = c.at("logits").get<std::vector<float>>();
    const auto expected = c.at("probs").get<std::vector<double>>();
    const TokenChoice choice = choice_of(c, 1234);
    const int draws = 40000;
    std::vector<int> counts(logits.size(), 0);
    for (int i = 0; i < draws; ++i) ++counts[size_t(choose_token(logits.data(), int64_t(logits.size()), choice, uint64_t(i)))];
    for (size_t v = 0; v < logits.size(); ++v) {
      const double p = expected[v], frequency = double(counts[v]) / draws;
      if (p == 0) {
        EXPECT_EQ(counts[v], 0) << "token " << v << " is outside the kept set of " << c.dump();
      } else {
        EXPECT_NEAR(frequency, p, 5 * std::sqrt(p * (1 - p) / draws) + 1e-4) << "token " << v << " of " << c.dump();
      }
    }
  }
}

// The plain way, which the sampler's selection must equal: sort the whole vocabulary most likely
// first, softmax in double, cut to top_k, then to the shortest prefix whose probability reaches
// top_p, then to those at least min_p times as likely as the most likely.
std::vector<std::pair<int32_t, double>> sorted_reference(const std::vector<float>& logits, const TokenChoice& choice) {
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  if (choice.top_k > 0 && size_t(choice.top_k) < order.size()) order.resize(size_t(choice.top_k));
  std::vector<std::pair<int32_t, double>> kept;
  double sum = 0;
  for (int32_t id : order) {
    kept.emplace_back(id, std::exp((double(logits[id]) - logits[order[0]]) / choice.temperature));
    sum += kept.back().second;
  }
  for (auto& token : kept) token.second /= sum;
  if (choice.top_p < 1) {
    double cumulative = 0;
    size_t n = 0;
    while (n < kept.size() && cumulative < choice.top_p) cumulative += kept[n++].second;
    kept.resize(n);
    for (auto& token : kept) token.second /= cumulative;
  }
  if (choice.min_p > 0) {  // those at least min_p times as likely as the first
    const double top = kept[0].second;
    size_t n = 0;
    while (n < kept.size() && kept[n].second >= choice.min_p * top) ++n;
    kept.resize(n);
    double sum = 0;
    for (const auto& token : kept) sum += token.second;
    for (auto& token : kept) token.second /= sum;
  }
  return kept;
}

// Logits of a 128k vocabulary: peaked (a trained model's), flat (a random model's: top_p keeps
// most of it), with runs of equal values (ties at the cuts), and with masked tokens (-inf).
std::vector<std::vector<float>> large_vocabulary_logits() {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  const size_t V = 128256;
  std::vector<float> peaked(V), flat(V), tied(V), masked(V);
  for (size_t v = 0; v < V; ++v) {
    peaked[v] = 4.0f * normal(rng);
    flat[v] = 0.05f * normal(rng);
    tied[v] = float(int(normal(rng) * 3.0f));  // a few distinct values, each shared by thousands
    masked[v] = v % 3 == 0 ? -INFINITY : normal(rng);
  }
  return {peaked, flat, tied, masked};
}

TEST(TokenChoice, TheKeptTokensAreThoseOfSortingTheWholeVocabulary) {
  std::vector<TokenChoice> choices = {{1.0f, 0, 1.0f, 0},   {0.7f, 0, 0.9f, 0},  {1.3f, 50, 1.0f, 0},
                                      {0.8f, 40, 0.95f, 0}, {1.0f, 0, 0.05f, 0}, {2.0f, 70000, 0.5f, 0}};
  choices.push_back({1.0f, 0, 1.0f, 0, 0.05f});
  choices.push_back({0.9f, 200, 0.9f, 0, 0.01f});
  std::vector<std::vector<float>> vocabularies = large_vocabulary_logits();
  vocabularies.push_back(vocabularies.front());  // and two logits at float's ends: high - low = inf
  vocabularies.back()[7] = -3e38f, vocabularies.back()[70000] = 3e38f;
  for (const auto& logits : vocabularies) {
    for (const TokenChoice& choice : choices) {
      const auto got = sampling_distribution(logits.data(), int64_t(logits.size()), choice);
      const auto expected = sorted_reference(logits, choice);
      ASSERT_EQ(got.size(), expected.size()) << "top_k " << choice.top_k << " top_p " << choice.top_p;
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(got[i].first, expected[i].first) << "rank " << i << ", top_k " << choice.top_k << " top_p " << choice.top_p;
        ASSERT_NEAR(got[i].second, expected[i].second, 1e-12 + 1e-9 * expected[i].second) << "rank " << i;
      }
    }
  }
}

TEST(TokenChoice, ADrawAtUIsTheKeptTokenInIdOrderWhoseCumulativeProbabilityPassesU) {
  const std::vector<TokenChoice> choices = {{1.0f, 0, 1.0f, 0}, {0.7f, 0, 0.9f, 0}, {0.8f, 40, 0.95f, 0}};
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  for (const auto& logits : large_vocabulary_logits()) {
    for (const TokenChoice& choice : choices) {
      auto by_id = sorted_reference(logits, choice);
      std::sort(by_id.begin(), by_id.end());
      for (int i = 0; i < 60; ++i) {
        const double u = i == 0 ? 0.0 : i == 1 ? std::nextafter(1.0, 0.0) : uniform(rng);
        double cumulative = 0;
        int32_t expected = by_id.back().first;
        for (const auto& [id, p] : by_id) {
          cumulative += p;
          if (u < cumulative) {
            expected = id;
            break;
          }
        }
        EXPECT_EQ(sample_token(logits.data(), int64_t(logits.size()), choice, u), expected) << "u " << u << " top_p " << choice.top_p;
      }
    }
  }
}

TEST(TokenChoice, GreedyTakesTheLargestAndTheLowestIdAmongEquals) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f};
  for (uint64_t i = 0; i < 5; ++i) EXPECT_EQ(choose_token(logits.data(), 5, TokenChoice{}, i), 1);
  EXPECT_EQ(argmax_token(logits.data(), 5), 1);
  // top_k 1 samples the greedy token whatever the draw.
  for (uint64_t i = 0; i < 50; ++i) EXPECT_EQ(choose_token(logits.data(), 5, TokenChoice{1.0f, 1, 1.0f, 9}, i), 1);
}

TEST(TokenChoice, TheSameSeedAndIndexDrawTheSameTokenAndOtherSeedsOthers) {
  const std::vector<float> logits(50, 0.0f);  // uniform: every draw is equally likely anything
  const TokenChoice a{1.0f, 0, 1.0f, 7}, b{1.0f, 0, 1.0f, 8};
  std::vector<int32_t> first, again, other;
  for (uint64_t i = 0; i < 20; ++i) {
    first.push_back(choose_token(logits.data(), 50, a, i));
    again.push_back(choose_token(logits.data(), 50, a, i));
    other.push_back(choose_token(logits.data(), 50, b, i));
  }
  EXPECT_EQ(first, again);
  EXPECT_NE(first, other);
  EXPECT_GT(std::set<int32_t>(first.begin(), first.end()).size(), 10u);  // 20 draws of 50: not one token
}

TEST(TokenChoice, RefusesOptionsOutOfRangeNamingThem) {
  const std::vector<float> logits = {0.0f, 1.0f};
  auto message = [&](const TokenChoice& choice) {
    try {
      choose_token(logits.data(), 2, choice, 0);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({-0.5f, 0, 1.0f, 0}).find("temperature"), std::string::npos);
  EXPECT_NE(message({NAN, 0, 1.0f, 0}).find("temperature"), std::string::npos);
  EXPECT_NE(message({1.0f, -3, 1.0f, 0}).find("top_k"), std::string::npos);
  EXPECT_NE(message({1.0f, 0, 0.0f, 0}).find("top_p"), std::string::npos);
  EXPECT_NE(message({1.0f, 0, 1.5f, 0}).find("top_p"), std::string::npos);
}

}  // namespace
}  // namespace ktune::model
