// load_tokenizer: picks the format from the file's content, not its name — a JSON object with a
// "model" is a tokenizer.json, a JSON object of token → id is a vocab.json (merges.txt beside it or
// given), lines of `base64 rank` are a tiktoken file, anything else is tried as a SentencePiece
// model. It deliberately does not download or guess paths beyond merges.txt next to vocab.json.
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "text/tokenizer.h"
#include "text/tokenizer_formats.h"

namespace ktune {

namespace {

enum class Format { kTokenizerJson, kVocabJson, kTiktoken, kSentencePiece };

// The format, and for JSON files the parsed content (so that it is parsed once).
Format detect_format(const std::string& path, nlohmann::json* parsed) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path, "cannot open the tokenizer file (does it exist and is it readable?)");
  std::string head(4096, '\0');
  in.read(head.data(), std::streamsize(head.size()));
  head.resize(size_t(in.gcount()));
  size_t i = head.find_first_not_of(" \t\r\n");
  if (i != std::string::npos && head[i] == '{') {
    *parsed = text::read_json_file(path);
    // A tokenizer.json has a "model" object; a vocab.json is a flat token → id object (which may
    // well hold a token spelled "model", whose value is then an id).
    if (parsed->is_object() && parsed->contains("model") && parsed->at("model").is_object()) return Format::kTokenizerJson;
    if (parsed->is_object()) return Format::kVocabJson;
    throw Error(path, "a JSON file that is neither a tokenizer.json nor a vocab.json");
  }
  // tiktoken: the first line is `base64 rank`.
  size_t eol = head.find('\n');
  std::string first = head.substr(0, eol);
  if (!first.empty() && first.back() == '\r') first.pop_back();
  size_t space = first.find(' ');
  if (space != std::string::npos && space > 0 && space + 1 < first.size() &&
      first.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=") == space &&
      first.find_first_not_of("0123456789", space + 1) == std::string::npos)
    return Format::kTiktoken;
  return Format::kSentencePiece;
}

}  // namespace

std::string tokenizer_config_beside(const std::string& tokenizer_path) {
  const std::filesystem::path config = std::filesystem::path(tokenizer_path).parent_path() / "tokenizer_config.json";
  std::error_code ec;
  return std::filesystem::is_regular_file(config, ec) ? config.string() : std::string();
}

std::unique_ptr<Tokenizer> load_tokenizer(const TokenizerOptions& options) {
  if (options.path.empty()) throw Error("tokenizer", "no tokenizer file given");
  nlohmann::json parsed;
  Format format = detect_format(options.path, &parsed);
  switch (format) {
    case Format::kTokenizerJson:
      return text::load_hf_tokenizer_json(options.path, options.config_path, &parsed);
    case Format::kVocabJson: {
      std::string merges = options.merges_file;
      if (merges.empty()) merges = (std::filesystem::path(options.path).parent_path() / "merges.txt").string();
      if (!std::filesystem::exists(merges))
        throw Error(options.path, "is a vocab.json, which needs its merges file: " + merges +
                                      " does not exist (pass merges_file / --merges)");
      return text::load_vocab_merges_tokenizer(options.path, merges, options.config_path, &parsed);
    }
    case Format::kTiktoken:
      return text::load_tiktoken_tokenizer(options.path, options.config_path);
    case Format::kSentencePiece:
      return text::load_sentencepiece_tokenizer(options.path, options.config_path);
  }
  throw Error(options.path, "unknown tokenizer format");
}

}  // namespace ktune
