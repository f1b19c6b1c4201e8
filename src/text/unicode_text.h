// UTF-8 facts the tokenizers need: validation (with the offset of the first bad byte), code-point
// iteration, lossy decoding of byte strings (U+FFFD for each maximal invalid subpart, as Python's
// errors="replace" and Rust's from_utf8_lossy do), Unicode normalisation forms through utf8proc,
// and the character classes HF tokenizers' added-token matching uses (whitespace, word chars).
// It deliberately does not segment words or know any tokenizer format.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ktune::text {

// The byte offset of the first byte that is not part of well-formed UTF-8, or npos when valid.
size_t find_invalid_utf8(std::string_view s);
// Throws ktune::Error("<where>", "invalid UTF-8 at byte N ...") unless s is well-formed UTF-8.
void require_valid_utf8(std::string_view s, const std::string& where);

// Decodes the code point at s[i] (s must be valid UTF-8); returns its byte length.
inline int utf8_decode(std::string_view s, size_t i, char32_t* cp) {
  unsigned char c = (unsigned char)s[i];
  if (c < 0x80) { *cp = c; return 1; }
  if (c < 0xE0) { *cp = ((c & 0x1F) << 6) | (s[i + 1] & 0x3F); return 2; }
  if (c < 0xF0) { *cp = ((c & 0x0F) << 12) | ((s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F); return 3; }
  *cp = ((c & 0x07) << 18) | ((s[i + 1] & 0x3F) << 12) | ((s[i + 2] & 0x3F) << 6) | (s[i + 3] & 0x3F);
  return 4;
}
// The byte length of the UTF-8 sequence that starts with lead byte c (1 for a stray byte).
inline int utf8_length(unsigned char c) { return c < 0x80 ? 1 : c < 0xC0 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }
void utf8_append(std::string& out, char32_t cp);

// Bytes → valid UTF-8, each maximal invalid subpart replaced by U+FFFD.
std::string utf8_lossy(std::string_view bytes);

enum class NormalForm { kNfc, kNfd, kNfkc, kNfkd };
// s in the given normal form (s must be valid UTF-8). Skips the work when s is already in it
// (ASCII, or only characters that neither decompose nor combine).
std::string unicode_normalize(std::string_view s, NormalForm form);
// Unicode-aware lowercasing (utf8proc's simple case mapping), as HF's Lowercase normalizer.
std::string unicode_lowercase(std::string_view s);

// Rust's char::is_whitespace (the White_Space property) and HF's is_word_character
// (alphanumeric or '_'), which decide lstrip/rstrip/single_word for added tokens.
bool is_unicode_whitespace(char32_t cp);
bool is_word_character(char32_t cp);

}  // namespace ktune::text
