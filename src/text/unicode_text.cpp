// UTF-8 validation, lossy decoding and Unicode normalisation (utf8proc) for the tokenizers.
// Well-formedness follows the Unicode standard's Table 3-7 (no overlongs, no surrogates, ≤ U+10FFFF).
#include "text/unicode_text.h"

#include <utf8proc.h>

#include <cstdlib>
#include <memory>

#include "core/error.h"
#include "core/utf8.h"

namespace ktune::text {


size_t find_invalid_utf8(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    // Fast path: 8 ASCII bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      __builtin_memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    int bad;
    int len = utf8_well_formed_length(s, i, &bad);
    if (len == 0) return i;
    i += len;
  }
  return std::string_view::npos;
}

void require_valid_utf8(std::string_view s, const std::string& where) {
  size_t bad = find_invalid_utf8(s);
  if (bad == std::string_view::npos) return;
  char hex[8];
  std::snprintf(hex, sizeof hex, "0x%02X", (unsigned char)s[bad]);
  throw Error(where, "invalid UTF-8 at byte " + std::to_string(bad) + " (byte " + hex +
                         "); tokenizers take UTF-8 text only, fix or re-encode the input");
}

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    int bad;
    int len = utf8_well_formed_length(s, i, &bad);
    if (len > 0) {
      out.append(s.data() + i, len);
      i += len;
    } else {
      out.append("\xEF\xBF\xBD");
      i += bad;
    }
  }
  return out;
}

namespace {

// True when the code point can change under canonical normalisation: it decomposes canonically,
// combines with a neighbour, has a non-zero combining class, or is Hangul (composed algorithmically).
bool may_change_under_normalization(char32_t cp, bool compat) {
  if (cp < 0x80) return false;
  if ((cp >= 0x1100 && cp <= 0x11FF) || (cp >= 0xAC00 && cp <= 0xD7A3) || (cp >= 0xA960 && cp <= 0xA97F) ||
      (cp >= 0xD7B0 && cp <= 0xD7FF))
    return true;
  const utf8proc_property_t* p = utf8proc_get_property(utf8proc_int32_t(cp));
  if (p->combining_class != 0) return true;
  if (p->comb_index != UINT16_MAX) return true;
  if (p->decomp_seqindex != UINT16_MAX && (compat || p->decomp_type == 0)) return true;
  return false;
}

std::string utf8proc_apply(std::string_view s, int options) {
  utf8proc_uint8_t* out = nullptr;
  utf8proc_ssize_t len = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), utf8proc_ssize_t(s.size()),
                                      &out, utf8proc_option_t(options));
  if (len < 0) throw Error("unicode normalisation", utf8proc_errmsg(len));
  std::string result(reinterpret_cast<char*>(out), size_t(len));
  std::free(out);
  return result;
}

}  // namespace

std::string unicode_normalize(std::string_view s, NormalForm form) {
  const bool compat = form == NormalForm::kNfkc || form == NormalForm::kNfkd;
  bool needed = false;
  for (size_t i = 0; i < s.size() && !needed;) {
    if ((unsigned char)s[i] < 0x80) { ++i; continue; }
    char32_t cp;
    i += utf8_decode(s, i, &cp);
    needed = may_change_under_normalization(cp, compat);
  }
  if (!needed) return std::string(s);
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalForm::kNfc: options |= UTF8PROC_COMPOSE; break;
    case NormalForm::kNfd: options |= UTF8PROC_DECOMPOSE; break;
    case NormalForm::kNfkc: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case NormalForm::kNfkd: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
  }
  return utf8proc_apply(s, options);
}

std::string unicode_lowercase(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    char32_t cp;
    i += utf8_decode(s, i, &cp);
    utf8_append(out, char32_t(utf8proc_tolower(utf8proc_int32_t(cp))));
  }
  return out;
}

bool is_unicode_whitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
         c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool is_word_character(char32_t c) {
  if (c == '_') return true;
  if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  utf8proc_category_t cat = utf8proc_category(utf8proc_int32_t(c));
  // Rust's char::is_alphanumeric: Alphabetic or Numeric (letters, Nl, Nd, No; marks are not included).
  return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) || cat == UTF8PROC_CATEGORY_ND ||
         cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
}

}  // namespace ktune::text
