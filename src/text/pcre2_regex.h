// A compiled PCRE2 pattern (UTF + UCP, JIT when available) that reports the non-overlapping
// matches in a UTF-8 string, left to right: what HF tokenizers' `Split` pre-tokenizer and
// tiktoken's split pattern need (\p{L}, \p{N}, (?i:…), (?!\S) — which std::regex cannot do).
// It deliberately offers no captures and no replacement syntax; callers assemble results.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace ktune::text {

class Pcre2Regex {
 public:
  // where names the pattern's origin for errors ("tokenizer.json: pre_tokenizer.pattern.Regex").
  Pcre2Regex(std::string_view pattern, const std::string& where);
  ~Pcre2Regex();
  Pcre2Regex(const Pcre2Regex&) = delete;
  Pcre2Regex& operator=(const Pcre2Regex&) = delete;

  // Calls on_match(begin, end) (byte offsets into s) for each match. s must be valid UTF-8
  // (not re-checked here). An empty match advances by one character, as Rust's find_iter does.
  template <typename OnMatch>
  void for_each_match(std::string_view s, OnMatch&& on_match) const {
    size_t pos = 0;
    size_t begin, end;
    while (pos <= s.size() && next_match(s, pos, &begin, &end)) {
      on_match(begin, end);
      if (end > begin) {
        pos = end;
      } else {
        if (end >= s.size()) break;
        pos = end + 1;
        while (pos < s.size() && (static_cast<unsigned char>(s[pos]) & 0xC0) == 0x80) ++pos;
      }
    }
  }

  // The first match at or after byte `start`; false when there is none.
  bool next_match(std::string_view s, size_t start, size_t* begin, size_t* end) const;

  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  std::string where_;
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
};

}  // namespace ktune::text
