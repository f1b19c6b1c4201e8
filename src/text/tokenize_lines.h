// The engine of `ktune tokenize`: JSON lines in, JSON lines out. Encoding reads one JSON string
// per line and writes one JSON array of ids; decoding reads one JSON array of ids per line and
// writes one JSON string. A blank line gives a blank line, so output lines match input lines.
// Lines are processed in batches encoded in parallel. It deliberately parses nothing else
// (no bare text, no CSV): the data readers own those formats.
#pragma once

#include <cstddef>
#include <iosfwd>
#include <string>

#include "text/tokenizer.h"

namespace ktune {

struct TokenizeLinesOptions {
  bool add_bos = false;
  bool add_eos = false;
  bool decode = false;        // ids → text instead of text → ids
  bool skip_special = false;  // decode: drop special tokens
};

// Returns the number of lines converted. Errors name input_name and the line ("stdin:3").
size_t tokenize_json_lines(const Tokenizer& tokenizer, std::istream& in, std::ostream& out,
                           const TokenizeLinesOptions& options, const std::string& input_name);

}  // namespace ktune
