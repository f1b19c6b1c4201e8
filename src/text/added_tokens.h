// Added and special tokens, and the matcher that finds them in text before any pre-tokenisation,
// with HF tokenizers' rules: leftmost-longest, non-overlapping matches; `single_word` rejects a
// match touching a word character; `lstrip` / `rstrip` swallow the whitespace beside it.
// It deliberately does not normalise: the owner decides which text each matcher sees.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace ktune::text {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool special = true;
};

// One piece of split text: [begin, end) bytes, and the added token's id or −1 for plain text.
struct TextSegment {
  size_t begin;
  size_t end;
  int32_t id;
};

class AddedTokenMatcher {
 public:
  // pattern: the text to find (the token's content, normalised if the token is `normalized`).
  void add(std::string pattern, const AddedToken& token);
  bool empty() const { return entries_.empty(); }
  // Covers text with segments in order (plain segments are never empty). An empty text gives none.
  void split(std::string_view text, std::vector<TextSegment>& out) const;

 private:
  struct Entry {
    std::string pattern;
    int32_t id;
    bool single_word, lstrip, rstrip;
  };
  // Hashes a std::string or a std::string_view alike, so a piece of text is looked up without a copy.
  struct PatternHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
  };
  std::vector<Entry> entries_;  // one per distinct pattern, in the order added
  // Each pattern's entry (the first added, for a pattern added twice), and for each first byte the
  // lengths its patterns have, longest first: a match at a position is the longest of those lengths
  // whose piece of text is a pattern, found in a few lookups however many tokens there are.
  std::unordered_map<std::string, uint32_t, PatternHash, std::equal_to<>> by_pattern_;
  std::vector<std::vector<size_t>> lengths_by_first_byte_ = std::vector<std::vector<size_t>>(256);
};

}  // namespace ktune::text
