// Added-token matching (see added_tokens.h). At each position the pattern lengths of its first byte
// are tried longest first, each a hash lookup, which gives leftmost-longest matches; a match
// rejected by single_word is skipped whole, as HF's aho-corasick iteration resumes after it.
#include "text/added_tokens.h"

#include <algorithm>
#include <functional>

#include "text/unicode_text.h"

namespace ktune::text {

void AddedTokenMatcher::add(std::string pattern, const AddedToken& token) {
  if (pattern.empty()) return;
  // A pattern added again is not kept: the first entry is the one that matches.
  if (!by_pattern_.emplace(pattern, uint32_t(entries_.size())).second) return;
  entries_.push_back(Entry{pattern, token.id, token.single_word, token.lstrip, token.rstrip});
  auto& lengths = lengths_by_first_byte_[static_cast<unsigned char>(pattern[0])];
  auto at = std::lower_bound(lengths.begin(), lengths.end(), pattern.size(), std::greater<>());
  if (at == lengths.end() || *at != pattern.size()) lengths.insert(at, pattern.size());
}

namespace {

// The last / first code point of s (s non-empty, valid UTF-8).
char32_t last_char(std::string_view s) {
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  char32_t cp;
  utf8_decode(s, i, &cp);
  return cp;
}
char32_t first_char(std::string_view s) {
  char32_t cp;
  utf8_decode(s, 0, &cp);
  return cp;
}

}  // namespace

void AddedTokenMatcher::split(std::string_view text, std::vector<TextSegment>& out) const {
  size_t start_offset = 0;  // the end of the previous match
  size_t i = 0;
  const size_t n = text.size();
  while (i < n) {
    const Entry* hit = nullptr;
    for (size_t length : lengths_by_first_byte_[static_cast<unsigned char>(text[i])]) {
      if (length > n - i) continue;
      auto found = by_pattern_.find(text.substr(i, length));
      if (found != by_pattern_.end()) {
        hit = &entries_[found->second];
        break;
      }
    }
    if (!hit) {
      ++i;
      continue;
    }
    size_t start = i, stop = i + hit->pattern.size();
    i = stop;
    if (hit->single_word) {
      bool start_space = start == 0 || !is_word_character(last_char(text.substr(0, start)));
      bool stop_space = stop == n || !is_word_character(first_char(text.substr(stop)));
      if (!start_space || !stop_space) continue;
    }
    if (hit->lstrip) {
      size_t new_start = start;
      while (new_start > 0) {
        size_t p = new_start - 1;
        while (p > 0 && (static_cast<unsigned char>(text[p]) & 0xC0) == 0x80) --p;
        char32_t cp;
        utf8_decode(text, p, &cp);
        if (!is_unicode_whitespace(cp)) break;
        new_start = p;
      }
      start = std::max(new_start, start_offset);
    }
    if (hit->rstrip) {
      while (stop < n) {
        char32_t cp;
        int len = utf8_decode(text, stop, &cp);
        if (!is_unicode_whitespace(cp)) break;
        stop += len;
      }
      i = stop;
    }
    if (start_offset < start) out.push_back(TextSegment{start_offset, start, -1});
    out.push_back(TextSegment{start, stop, hit->id});
    start_offset = stop;
  }
  if (start_offset < n) out.push_back(TextSegment{start_offset, n, -1});
}

}  // namespace ktune::text
