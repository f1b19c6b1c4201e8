// `ktune tokenize`: text ↔ token ids from the command line, to script tokenizer checks and debug
// datasets. One JSON string per input line → one JSON array of ids per output line; with --decode,
// the other way. Reads stdin, or the files named after the options. The work is
// tokenize_json_lines (text layer); this file only reads arguments.
#include <cstdio>
#include <fstream>
#include <iostream>

#include "cli/command_table.h"
#include "cli/flag_args.h"
#include "core/error.h"
#include "text/tokenize_lines.h"
#include "text/tokenizer.h"

namespace ktune::cli {

namespace {

const char* kUsage =
    "usage: ktune tokenize --tokenizer FILE [--merges FILE] [--config FILE] [--add-bos] [--add-eos]\n"
    "                      [--decode [--skip-special]] [INPUT...]\n"
    "  FILE: tokenizer.json, tiktoken tokenizer.model, SentencePiece tokenizer.model, or vocab.json\n"
    "        (with merges.txt beside it or --merges); --config: tokenizer_config.json (added and special\n"
    "        tokens, BOS/EOS/PAD; default: the one beside FILE, as AutoTokenizer reads it)\n"
    "  input: one JSON string per line (stdin when no INPUT) → one JSON array of ids per line;\n"
    "         --decode: one JSON array of ids per line → one JSON string per line\n";

}  // namespace

int cmd_tokenize(const Args& args) {
  TokenizerOptions options;
  TokenizeLinesOptions lines;
  std::vector<std::string> inputs;
  FlagArgs a("ktune tokenize", args);
  while (a.next()) {
    if (a.is("--tokenizer")) options.path = a.value();
    else if (a.is("--merges")) options.merges_file = a.value();
    else if (a.is("--config")) options.config_path = a.value();
    else if (a.is("--add-bos")) a.expect_no_value(), lines.add_bos = true;
    else if (a.is("--add-eos")) a.expect_no_value(), lines.add_eos = true;
    else if (a.is("--decode")) a.expect_no_value(), lines.decode = true;
    else if (a.is("--skip-special")) a.expect_no_value(), lines.skip_special = true;
    else if (a.help()) {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (a.positional()) inputs.push_back(a.arg());
    else a.unknown(kUsage);
  }
  if (options.path.empty()) throw Error("ktune tokenize", std::string("--tokenizer is required\n") + kUsage);
  if (options.config_path.empty()) options.config_path = tokenizer_config_beside(options.path);
  std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(options);
  std::ios::sync_with_stdio(false);
  if (inputs.empty()) inputs.push_back("-");
  for (const std::string& input : inputs) {
    if (input == "-") {
      tokenize_json_lines(*tokenizer, std::cin, std::cout, lines, "stdin");
      continue;
    }
    std::ifstream in(input, std::ios::binary);
    if (!in) throw Error(input, "cannot open the input file");
    tokenize_json_lines(*tokenizer, in, std::cout, lines, input);
  }
  return 0;
}

}  // namespace ktune::cli
