// Allow/ignore file patterns as the Hugging Face Hub client applies them: Python fnmatch rules
// (`*` matches any run of characters, `/` included; `?` one character; `[seq]`, `[!seq]`), a
// pattern ending in `/` means "everything under that folder", and a file is kept when it matches
// some allow pattern (or none are given) and no ignore pattern. Case-sensitive, as on POSIX.
// It deliberately does not implement gitignore or `**` globstar semantics: `*` already crosses `/`.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace ktune::hub {

bool fnmatch_match(std::string_view pattern, std::string_view name);

// Splits "a, b c" on commas and whitespace (IGNORE_PATTERNS, --ignore-patterns); drops empties.
std::vector<std::string> split_pattern_list(std::string_view list);

struct PatternFilter {
  std::vector<std::string> allow;   // empty: everything allowed
  std::vector<std::string> ignore;  // applied after allow

  bool keeps(std::string_view path) const;
};

// The model initializer's default allow list (upstream's, plus *.txt for merges.txt).
std::vector<std::string> default_model_allow_patterns();

}  // namespace ktune::hub
