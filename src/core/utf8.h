// UTF-8 well-formedness, the Unicode standard's Table 3-7 (no overlongs, no surrogates, at most
// U+10FFFF): the one rule the tokenizers' validation (text/unicode_text.h) and the printing of
// error messages (log.h's printable) both apply.
#pragma once

#include <cstddef>
#include <string_view>

namespace ktune {

// The length of the well-formed sequence at s[i], or 0 with *bad_len set to the length of the
// maximal subpart of an ill-formed one (at least 1).
inline int utf8_well_formed_length(std::string_view s, size_t i, int* bad_len) {
  const size_t n = s.size();
  unsigned char c = (unsigned char)s[i];
  *bad_len = 1;
  if (c < 0x80) return 1;
  unsigned char lo = 0x80, hi = 0xBF;
  int len;
  if (c >= 0xC2 && c <= 0xDF) len = 2;
  else if (c == 0xE0) { len = 3; lo = 0xA0; }
  else if (c >= 0xE1 && c <= 0xEC) len = 3;
  else if (c == 0xED) { len = 3; hi = 0x9F; }
  else if (c >= 0xEE && c <= 0xEF) len = 3;
  else if (c == 0xF0) { len = 4; lo = 0x90; }
  else if (c >= 0xF1 && c <= 0xF3) len = 4;
  else if (c == 0xF4) { len = 4; hi = 0x8F; }
  else return 0;
  for (int k = 1; k < len; ++k) {
    if (i + k >= n) { *bad_len = k; return 0; }
    unsigned char b = (unsigned char)s[i + k];
    unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) { *bad_len = k; return 0; }
  }
  return len;
}

}  // namespace ktune
