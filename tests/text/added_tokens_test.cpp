// The added-token matcher on its own: leftmost-longest among many patterns that share their first
// bytes (a vocabulary's worth of "<wN>" words, as a tokenizer with tens of thousands of added
// tokens has), a pattern added twice matching as its first entry, plain text around the matches.
// The HF rules (single_word, lstrip, rstrip) are checked through whole tokenizers in tokenizer_test.
#include "text/added_tokens.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace ktune::text {
namespace {

AddedToken token(int32_t id) {
  AddedToken t;
  t.id = id;
  return t;
}

TEST(AddedTokenMatcher, FindsTheLongestOfManyPatternsSharingTheirFirstBytes) {
  AddedTokenMatcher matcher;
  for (int32_t id = 0; id < 50000; ++id) matcher.add("<w" + std::to_string(id) + ">", token(id));
  matcher.add("<w1", token(90001));  // a prefix of "<w1>" and "<w12>": loses to either where they match
  matcher.add("<w7>", token(90002));  // added twice: the first entry (id 7) matches
  const std::string text = "a<w12>b<w1>c<w99999>d<w1x<w7>";
  std::vector<TextSegment> segments;
  matcher.split(text, segments);
  std::vector<std::pair<std::string, int32_t>> got;
  for (const TextSegment& s : segments) got.emplace_back(text.substr(s.begin, s.end - s.begin), s.id);
  const std::vector<std::pair<std::string, int32_t>> expected = {
      {"a", -1}, {"<w12>", 12}, {"b", -1}, {"<w1>", 1}, {"c<w99999>d", -1}, {"<w1", 90001}, {"x", -1}, {"<w7>", 7}};
  EXPECT_EQ(got, expected);
}

TEST(AddedTokenMatcher, PlainTextAloneIsOneSegmentAndEmptyTextNone) {
  AddedTokenMatcher matcher;
  matcher.add("<|eot_id|>", token(5));
  std::vector<TextSegment> segments;
  matcher.split("", segments);
  EXPECT_TRUE(segments.empty());
  matcher.split("no tokens <|eot here", segments);
  ASSERT_EQ(segments.size(), 1u);
  EXPECT_EQ(segments[0].id, -1);
  EXPECT_EQ(segments[0].end, std::string("no tokens <|eot here").size());
}

}  // namespace
}  // namespace ktune::text
