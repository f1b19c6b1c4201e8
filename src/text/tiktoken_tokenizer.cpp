// Llama 3's tiktoken tokenizer.model: lines of `base64(token bytes) rank`. Loaded into the byte-level
// BpeTokenizer: tiktoken merges the adjacent pair whose concatenation has the lowest rank, which is
// a merge table entry (id(x), id(y)) → (rank(x+y), id(x+y)) for every token split into two tokens;
// a pre-token that is itself a token is taken whole (as tiktoken does, and HF's ignore_merges).
// Token ids are the ranks; the 256 special tokens follow the ranks with Meta's Llama 3.1 names.
// It deliberately knows only Llama 3's split pattern and special tokens (the only tiktoken file
// the fine-tuning recipes read).
#include <fstream>

#include "core/error.h"
#include "text/bpe_tokenizer.h"
#include "text/tokenizer_formats.h"

namespace ktune::text {

namespace {

constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

int base64_value(unsigned char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

bool base64_decode(std::string_view in, std::string* out) {
  out->clear();
  if (in.empty() || in.size() % 4 != 0) return false;
  size_t pad = 0;
  if (in.back() == '=') ++pad;
  if (in.size() >= 2 && in[in.size() - 2] == '=') ++pad;
  for (size_t i = 0; i < in.size(); i += 4) {
    int v[4];
    for (int k = 0; k < 4; ++k) {
      unsigned char c = (unsigned char)in[i + size_t(k)];
      bool last_quad = i + 4 == in.size();
      if (c == '=' && last_quad && size_t(k) >= 4 - pad) v[k] = 0;
      else if ((v[k] = base64_value(c)) < 0) return false;
    }
    uint32_t triple = (uint32_t(v[0]) << 18) | (uint32_t(v[1]) << 12) | (uint32_t(v[2]) << 6) | uint32_t(v[3]);
    out->push_back(char((triple >> 16) & 0xFF));
    if (!(i + 4 == in.size() && pad >= 2)) out->push_back(char((triple >> 8) & 0xFF));
    if (!(i + 4 == in.size() && pad >= 1)) out->push_back(char(triple & 0xFF));
  }
  return true;
}

// Meta's llama-models (Llama 3.1+) names for ids first..first+255; torchtune agrees on 0..10.
std::vector<std::string> llama3_special_tokens() {
  std::vector<std::string> names = {
      "<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
      "<|finetune_right_pad_id|>", "<|step_id|>", "<|start_header_id|>", "<|end_header_id|>",
      "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"};
  for (int i = 0; names.size() < 256; ++i) names.push_back("<|reserved_special_token_" + std::to_string(2 + i) + "|>");
  return names;
}

}  // namespace

std::unique_ptr<Tokenizer> load_tiktoken_tokenizer(const std::string& path, const std::string& config_path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path, "cannot open the file (does it exist and is it readable?)");
  auto tok = std::make_unique<BpeTokenizer>();
  tok->source = path;
  struct RawHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
  };
  std::unordered_map<std::string, int32_t, RawHash, std::equal_to<>> ranks;
  std::vector<std::pair<std::string, int32_t>> tokens;
  std::string line, bytes;
  int32_t max_rank = -1;
  for (size_t line_no = 1; std::getline(in, line); ++line_no) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    std::string where = path + ":" + std::to_string(line_no);
    size_t space = line.find(' ');
    if (space == std::string::npos) throw Error(where, "expected `base64-token rank`, got '" + line.substr(0, 60) + "'");
    if (!base64_decode(std::string_view(line).substr(0, space), &bytes))
      throw Error(where, "the token '" + line.substr(0, space) + "' is not valid base64");
    std::string rank_text = line.substr(space + 1);
    char* end = nullptr;
    long rank = std::strtol(rank_text.c_str(), &end, 10);
    if (rank_text.empty() || *end != '\0' || rank < 0 || rank > INT32_MAX)
      throw Error(where, "the rank '" + rank_text + "' is not a non-negative integer");
    if (!ranks.emplace(bytes, int32_t(rank)).second) throw Error(where, "duplicate token");
    tokens.emplace_back(bytes, int32_t(rank));
    max_rank = std::max(max_rank, int32_t(rank));
  }
  if (tokens.empty()) throw Error(path, "no `base64-token rank` lines: not a tiktoken file");
  const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::get();
  tok->vocab.reserve(tokens.size());
  for (const auto& [raw, rank] : tokens) {
    std::string spelled;
    for (unsigned char b : raw) spelled += alphabet.byte_to_utf8(b);
    tok->vocab.emplace(std::move(spelled), rank);
    for (size_t k = 1; k < raw.size(); ++k) {
      auto left = ranks.find(std::string_view(raw).substr(0, k));
      if (left == ranks.end()) continue;
      auto right = ranks.find(std::string_view(raw).substr(k));
      if (right == ranks.end()) continue;
      tok->merges.insert(left->second, right->second, rank, rank);
    }
  }
  tok->ignore_merges = true;
  PreTokenizerStep split;
  split.kind = PreTokenizerStep::Kind::kSplit;
  split.regex = std::make_shared<Pcre2Regex>(kLlama3Pattern, "Llama 3 split pattern");
  tok->pre_tokenizers.push_back(std::move(split));
  tok->byte_level = true;
  tok->has_decoder = true;
  tok->decoders.push_back(DecoderStep{DecoderStep::Kind::kByteLevel});
  int32_t next = max_rank + 1;
  for (const std::string& name : llama3_special_tokens()) {
    AddedToken a;
    a.content = name;
    a.id = next++;
    a.special = true;
    a.normalized = false;
    tok->added_tokens.push_back(std::move(a));
  }
  tok->finalize();
  // torchtune's llama3 tokenizer: BOS <|begin_of_text|>, EOS <|end_of_text|>, PAD <|finetune_right_pad_id|>.
  resolve_special_ids(*tok, config_path);
  return tok;
}

}  // namespace ktune::text
