// Python's str operations on UTF-8 text, counting code points as Python does: what a chat template
// calls on message content (strip, split, startswith, replace, title, ...) and what slicing and
// indexing a string mean. Case mapping and character classes come from utf8proc (Unicode's simple
// case mapping: "ß".upper() stays "ß" here, where Python gives "SS").
// Deliberately not here: str.format and regular expressions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ktune::jinja {

std::vector<std::string> code_points(std::string_view s);  // one string per code point
int64_t code_point_count(std::string_view s);
bool is_python_space(char32_t cp);  // str.isspace() of one character, and what split() splits on

std::string py_upper(std::string_view s);
std::string py_lower(std::string_view s);
std::string py_title(std::string_view s);       // str.title(): upper after a non-letter
std::string py_capitalize(std::string_view s);  // first upper, the rest lower
std::string py_swapcase(std::string_view s);

// chars: the set of characters to strip; nullopt strips whitespace.
std::string py_strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right);
// sep nullopt: split on whitespace runs, dropping empty strings. maxsplit < 0: no limit.
std::vector<std::string> py_split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit);
std::vector<std::string> py_rsplit(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit);
std::vector<std::string> py_splitlines(std::string_view s, bool keepends);
std::string py_replace(std::string_view s, std::string_view old, std::string_view with, int64_t count);
int64_t py_find(std::string_view s, std::string_view sub, bool from_right);  // code point index or -1
int64_t py_count(std::string_view s, std::string_view sub);

enum class CharClass { kAlpha, kDigit, kAlnum, kSpace, kLower, kUpper, kDecimal, kNumeric };
bool py_is(std::string_view s, CharClass what);  // str.isalpha() and friends

}  // namespace ktune::jinja
