#include "hub/patterns.h"

namespace ktune::hub {

// Matches a bracket expression starting at pattern[i] ('['); sets `next` past its ']'.
// Returns -1 when the bracket is unterminated (then '[' is an ordinary character, as in Python).
static int match_bracket(std::string_view p, size_t i, char c, size_t& next) {
  size_t j = i + 1;
  bool negate = false;
  if (j < p.size() && p[j] == '!') {
    negate = true;
    ++j;
  }
  size_t start = j;
  bool matched = false;
  while (j < p.size() && (p[j] != ']' || j == start)) {
    if (j + 2 < p.size() && p[j + 1] == '-' && p[j + 2] != ']') {
      if (p[j] <= c && c <= p[j + 2]) matched = true;
      j += 3;
    } else {
      if (p[j] == c) matched = true;
      ++j;
    }
  }
  if (j >= p.size()) return -1;
  next = j + 1;
  return matched != negate ? 1 : 0;
}

bool fnmatch_match(std::string_view p, std::string_view s) {
  // Iterative wildcard matching with single-star backtracking (linear in practice).
  size_t pi = 0, si = 0;
  size_t star_p = std::string_view::npos, star_s = 0;
  while (si < s.size()) {
    if (pi < p.size()) {
      char pc = p[pi];
      if (pc == '*') {
        star_p = pi++;
        star_s = si;
        continue;
      }
      if (pc == '?') {
        ++pi;
        ++si;
        continue;
      }
      if (pc == '[') {
        size_t next = 0;
        int r = match_bracket(p, pi, s[si], next);
        if (r == 1) {
          pi = next;
          ++si;
          continue;
        }
        if (r == -1 && s[si] == '[') {
          ++pi;
          ++si;
          continue;
        }
      } else if (pc == s[si]) {
        ++pi;
        ++si;
        continue;
      }
    }
    if (star_p == std::string_view::npos) return false;
    pi = star_p + 1;
    si = ++star_s;
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

std::vector<std::string> split_pattern_list(std::string_view list) {
  // As upstream's initializers: comma-separated, each stripped of surrounding whitespace (a space
  // inside a pattern is part of it: file names may have spaces).
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    if (comma == std::string_view::npos) comma = list.size();
    std::string_view item = list.substr(start, comma - start);
    const size_t first = item.find_first_not_of(" \t\r\n");
    if (first != std::string_view::npos) {
      const size_t last = item.find_last_not_of(" \t\r\n");
      out.emplace_back(item.substr(first, last - first + 1));
    }
    start = comma + 1;
  }
  return out;
}

static bool matches_any(const std::vector<std::string>& patterns, std::string_view path) {
  for (const std::string& pat : patterns) {
    if (!pat.empty() && pat.back() == '/') {
      if (fnmatch_match(pat + "*", path)) return true;
    } else if (fnmatch_match(pat, path)) {
      return true;
    }
  }
  return false;
}

bool PatternFilter::keeps(std::string_view path) const {
  if (!allow.empty() && !matches_any(allow, path)) return false;
  return !matches_any(ignore, path);
}

std::vector<std::string> default_model_allow_patterns() { return {"*.json", "*.safetensors", "*.model", "*.txt"}; }

}  // namespace ktune::hub
