// Python's str methods over UTF-8, code point by code point (utf8proc for case and categories).
#include "text/jinja/python_str.h"

#include <utf8proc.h>

#include <algorithm>

#include "text/jinja/template_error.h"
#include "text/unicode_text.h"

namespace ktune::jinja {

namespace {

std::vector<char32_t> decode(std::string_view s) {
  std::vector<char32_t> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    char32_t cp;
    i += text::utf8_decode(s, i, &cp);
    out.push_back(cp);
  }
  return out;
}

std::string encode(const std::vector<char32_t>& cps, size_t begin, size_t end) {
  std::string out;
  for (size_t i = begin; i < end; ++i) text::utf8_append(out, cps[i]);
  return out;
}

utf8proc_category_t category(char32_t cp) { return utf8proc_category(utf8proc_int32_t(cp)); }
bool is_cased(char32_t cp) {
  utf8proc_category_t c = category(cp);
  return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT;
}
bool is_letter(char32_t cp) {
  utf8proc_category_t c = category(cp);
  return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT ||
         c == UTF8PROC_CATEGORY_LM || c == UTF8PROC_CATEGORY_LO;
}
char32_t to_upper(char32_t cp) { return char32_t(utf8proc_toupper(utf8proc_int32_t(cp))); }
char32_t to_lower(char32_t cp) { return char32_t(utf8proc_tolower(utf8proc_int32_t(cp))); }
char32_t to_title(char32_t cp) { return char32_t(utf8proc_totitle(utf8proc_int32_t(cp))); }

template <typename F>
std::string map_chars(std::string_view s, F f) {
  std::string out;
  out.reserve(s.size());
  for (char32_t cp : decode(s)) text::utf8_append(out, f(cp));
  return out;
}

}  // namespace

std::vector<std::string> code_points(std::string_view s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    size_t n = std::min<size_t>(text::utf8_length((unsigned char)s[i]), s.size() - i);
    out.emplace_back(s.substr(i, n));
    i += n;
  }
  return out;
}

int64_t code_point_count(std::string_view s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

bool is_python_space(char32_t cp) {
  if (cp <= 0x20) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1F);
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
         cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

std::string py_upper(std::string_view s) { return map_chars(s, to_upper); }
std::string py_lower(std::string_view s) { return map_chars(s, to_lower); }
std::string py_swapcase(std::string_view s) {
  return map_chars(s, [](char32_t cp) {
    utf8proc_category_t c = category(cp);
    return c == UTF8PROC_CATEGORY_LU ? to_lower(cp) : c == UTF8PROC_CATEGORY_LL ? to_upper(cp) : cp;
  });
}

std::string py_title(std::string_view s) {
  std::string out;
  bool previous_is_cased = false;
  for (char32_t cp : decode(s)) {
    text::utf8_append(out, previous_is_cased ? to_lower(cp) : to_title(cp));
    previous_is_cased = is_cased(cp);
  }
  return out;
}

std::string py_capitalize(std::string_view s) {
  std::string out;
  bool first = true;
  for (char32_t cp : decode(s)) {
    text::utf8_append(out, first ? to_title(cp) : to_lower(cp));
    first = false;
  }
  return out;
}

std::string py_strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right) {
  std::vector<char32_t> cps = decode(s);
  std::vector<char32_t> set = chars ? decode(*chars) : std::vector<char32_t>{};
  auto strippable = [&](char32_t cp) {
    return chars ? std::find(set.begin(), set.end(), cp) != set.end() : is_python_space(cp);
  };
  size_t begin = 0, end = cps.size();
  if (left)
    while (begin < end && strippable(cps[begin])) ++begin;
  if (right)
    while (end > begin && strippable(cps[end - 1])) --end;
  return encode(cps, begin, end);
}

std::vector<std::string> py_split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) fail("ValueError: empty separator");
    size_t start = 0;
    while (maxsplit < 0 || int64_t(out.size()) < maxsplit) {
      size_t at = s.find(*sep, start);
      if (at == std::string_view::npos) break;
      out.emplace_back(s.substr(start, at - start));
      start = at + sep->size();
    }
    out.emplace_back(s.substr(start));
    return out;
  }
  std::vector<char32_t> cps = decode(s);
  size_t i = 0, n = cps.size();
  while (true) {
    while (i < n && is_python_space(cps[i])) ++i;
    if (i == n) break;
    if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) {
      out.push_back(encode(cps, i, n));
      break;
    }
    size_t j = i;
    while (j < n && !is_python_space(cps[j])) ++j;
    out.push_back(encode(cps, i, j));
    i = j;
  }
  return out;
}

std::vector<std::string> py_rsplit(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) fail("ValueError: empty separator");
    size_t end = s.size();
    while (maxsplit < 0 || int64_t(out.size()) < maxsplit) {
      if (end < sep->size()) break;
      size_t at = s.rfind(*sep, end - sep->size());
      if (at == std::string_view::npos) break;
      out.emplace_back(s.substr(at + sep->size(), end - at - sep->size()));
      end = at;
    }
    out.emplace_back(s.substr(0, end));
    std::reverse(out.begin(), out.end());
    return out;
  }
  std::vector<char32_t> cps = decode(s);
  size_t j = cps.size();
  while (true) {
    while (j > 0 && is_python_space(cps[j - 1])) --j;
    if (j == 0) break;
    if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) {
      out.push_back(encode(cps, 0, j));
      break;
    }
    size_t i = j;
    while (i > 0 && !is_python_space(cps[i - 1])) --i;
    out.push_back(encode(cps, i, j));
    j = i;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> py_splitlines(std::string_view s, bool keepends) {
  std::vector<char32_t> cps = decode(s);
  std::vector<std::string> out;
  size_t start = 0, i = 0;
  while (i < cps.size()) {
    char32_t c = cps[i];
    bool is_break = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || (c >= 0x1C && c <= 0x1E) || c == 0x85 ||
                    c == 0x2028 || c == 0x2029;
    if (!is_break) {
      ++i;
      continue;
    }
    size_t end = i;
    i += (c == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') ? 2 : 1;
    out.push_back(encode(cps, start, keepends ? i : end));
    start = i;
  }
  if (start < cps.size()) out.push_back(encode(cps, start, cps.size()));
  return out;
}

std::string py_replace(std::string_view s, std::string_view old, std::string_view with, int64_t count) {
  std::string out;
  if (old.empty()) {
    std::vector<std::string> cps = code_points(s);
    int64_t done = 0;
    for (const std::string& cp : cps) {
      if (count < 0 || done < count) { out += with; ++done; }
      out += cp;
    }
    if (count < 0 || done < count) out += with;
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t at = s.find(old, start);
    if (at == std::string_view::npos) break;
    out.append(s.substr(start, at - start));
    out.append(with);
    start = at + old.size();
    ++done;
  }
  out.append(s.substr(start));
  return out;
}

int64_t py_find(std::string_view s, std::string_view sub, bool from_right) {
  size_t at = from_right ? s.rfind(sub) : s.find(sub);
  if (at == std::string_view::npos) return -1;
  return code_point_count(s.substr(0, at));
}

int64_t py_count(std::string_view s, std::string_view sub) {
  if (sub.empty()) return code_point_count(s) + 1;
  int64_t n = 0;
  for (size_t at = s.find(sub); at != std::string_view::npos; at = s.find(sub, at + sub.size())) ++n;
  return n;
}

bool py_is(std::string_view s, CharClass what) {
  std::vector<char32_t> cps = decode(s);
  if (what == CharClass::kLower || what == CharClass::kUpper) {
    bool any_cased = false;
    for (char32_t cp : cps) {
      utf8proc_category_t c = category(cp);
      if (c == UTF8PROC_CATEGORY_LT) return false;
      if (c == UTF8PROC_CATEGORY_LU) {
        if (what == CharClass::kLower) return false;
        any_cased = true;
      } else if (c == UTF8PROC_CATEGORY_LL) {
        if (what == CharClass::kUpper) return false;
        any_cased = true;
      }
    }
    return any_cased;
  }
  if (cps.empty()) return false;
  for (char32_t cp : cps) {
    utf8proc_category_t c = category(cp);
    bool decimal = c == UTF8PROC_CATEGORY_ND;
    bool numeric = decimal || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
    bool ok = false;
    switch (what) {
      case CharClass::kAlpha: ok = is_letter(cp); break;
      case CharClass::kDigit: ok = decimal || c == UTF8PROC_CATEGORY_NO; break;
      case CharClass::kDecimal: ok = decimal; break;
      case CharClass::kNumeric: ok = numeric; break;
      case CharClass::kAlnum: ok = is_letter(cp) || numeric; break;
      case CharClass::kSpace: ok = is_python_space(cp); break;
      default: break;
    }
    if (!ok) return false;
  }
  return true;
}

}  // namespace ktune::jinja
