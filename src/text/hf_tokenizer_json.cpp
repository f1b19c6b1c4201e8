// Reads HF tokenizer.json (BPE models) into a BpeTokenizer, and vocab.json + merges.txt (Qwen, as
// torchtune's qwen2 tokenizer reads them) into the same pipeline. Every unsupported component is
// refused by its key and type ("tokenizer.json: normalizer.type: 'Precompiled' is not supported");
// nothing is silently ignored except what only affects offsets (the ByteLevel post-processor) and
// BPE dropout (a training-time augmentation; ktune encodes deterministically).
#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

#include "core/error.h"
#include "text/bpe_tokenizer.h"
#include "text/tokenizer_formats.h"

namespace ktune::text {

using nlohmann::json;

namespace {

constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Reads one tokenizer.json with its path in every message.
class JsonReader {
 public:
  explicit JsonReader(std::string path) : path_(std::move(path)) {}

  json parse(const std::string& text) const {
    try {
      return json::parse(text);
    } catch (const json::parse_error& e) {
      throw Error(path_, std::string("not valid JSON: ") + e.what());
    }
  }
  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw Error(path_ + ": " + key, what);
  }
  const json& require(const json& obj, const std::string& key, const std::string& at) const {
    if (!obj.is_object()) fail(at, "must be an object");
    auto it = obj.find(key);
    if (it == obj.end()) fail(at.empty() ? key : at + "." + key, "missing");
    return *it;
  }
  std::string get_string(const json& obj, const std::string& key, const std::string& at) const {
    const json& v = require(obj, key, at);
    if (!v.is_string()) fail(at + "." + key, "must be a string");
    return v.get<std::string>();
  }
  bool get_bool(const json& obj, const std::string& key, const std::string& at, bool fallback) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) fail(at + "." + key, "must be true or false");
    return it->get<bool>();
  }
  std::optional<std::string> get_optional_string(const json& obj, const std::string& key, const std::string& at) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return std::nullopt;
    if (!it->is_string()) fail(at + "." + key, "must be a string or null");
    return it->get<std::string>();
  }
  // A Split/Replace pattern: {"String": s} or {"Regex": r}.
  void get_pattern(const json& obj, const std::string& at, std::string* literal, std::shared_ptr<Pcre2Regex>* regex) const {
    const json& p = require(obj, "pattern", at);
    if (p.is_object() && p.contains("Regex") && p["Regex"].is_string()) {
      *regex = std::make_shared<Pcre2Regex>(p["Regex"].get<std::string>(), path_ + ": " + at + ".pattern.Regex");
    } else if (p.is_object() && p.contains("String") && p["String"].is_string()) {
      *literal = p["String"].get<std::string>();
    } else {
      fail(at + ".pattern", "must be {\"String\": …} or {\"Regex\": …}");
    }
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string type_of(const JsonReader& r, const json& obj, const std::string& at) {
  if (!obj.is_object()) r.fail(at, "must be an object");
  return r.get_string(obj, "type", at);
}

void parse_normalizer(const JsonReader& r, const json& n, const std::string& at, std::vector<NormalizerStep>& out) {
  if (n.is_null()) return;
  std::string type = type_of(r, n, at);
  using K = NormalizerStep::Kind;
  NormalizerStep st{};
  if (type == "Sequence") {
    const json& list = r.require(n, "normalizers", at);
    if (!list.is_array()) r.fail(at + ".normalizers", "must be an array");
    for (size_t i = 0; i < list.size(); ++i)
      parse_normalizer(r, list[i], at + ".normalizers[" + std::to_string(i) + "]", out);
    return;
  }
  if (type == "NFC") st.kind = K::kNfc;
  else if (type == "NFD") st.kind = K::kNfd;
  else if (type == "NFKC") st.kind = K::kNfkc;
  else if (type == "NFKD") st.kind = K::kNfkd;
  else if (type == "Lowercase") st.kind = K::kLowercase;
  else if (type == "Replace") {
    st.kind = K::kReplace;
    r.get_pattern(n, at, &st.pattern, &st.regex);
    st.content = r.get_string(n, "content", at);
  } else if (type == "Prepend") {
    st.kind = K::kPrepend;
    st.content = r.get_string(n, "prepend", at);
  } else if (type == "Strip") {
    st.kind = K::kStrip;
    st.strip_left = r.get_bool(n, "strip_left", at, true);
    st.strip_right = r.get_bool(n, "strip_right", at, true);
  } else {
    r.fail(at + ".type", "'" + type +
                             "' is not supported (supported: NFC, NFD, NFKC, NFKD, Lowercase, Replace, Prepend, Strip, "
                             "Sequence)");
  }
  out.push_back(std::move(st));
}

SplitBehavior parse_behavior(const JsonReader& r, const json& obj, const std::string& at) {
  std::string b = r.get_string(obj, "behavior", at);
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  r.fail(at + ".behavior", "'" + b + "' is not a split behavior");
}

PreTokenizerStep::Prepend parse_prepend_scheme(const JsonReader& r, const json& obj, const std::string& at) {
  if (auto scheme = r.get_optional_string(obj, "prepend_scheme", at)) {
    if (*scheme == "always") return PreTokenizerStep::Prepend::kAlways;
    if (*scheme == "first") return PreTokenizerStep::Prepend::kFirst;
    if (*scheme == "never") return PreTokenizerStep::Prepend::kNever;
    r.fail(at + ".prepend_scheme", "'" + *scheme + "' is not one of always, first, never");
  }
  // Older files: add_prefix_space (default true).
  return r.get_bool(obj, "add_prefix_space", at, true) ? PreTokenizerStep::Prepend::kAlways
                                                       : PreTokenizerStep::Prepend::kNever;
}

void parse_pre_tokenizer(const JsonReader& r, const json& p, const std::string& at, BpeTokenizer& tok) {
  if (p.is_null()) return;
  std::string type = type_of(r, p, at);
  if (tok.byte_level)
    r.fail(at, "a '" + type + "' step after ByteLevel is not supported (ByteLevel must be the last pre-tokenizer)");
  using K = PreTokenizerStep::Kind;
  PreTokenizerStep st;
  auto regex = [&](const char* pattern) { return std::make_shared<Pcre2Regex>(pattern, r.path() + ": " + at); };
  if (type == "Sequence") {
    const json& list = r.require(p, "pretokenizers", at);
    if (!list.is_array()) r.fail(at + ".pretokenizers", "must be an array");
    for (size_t i = 0; i < list.size(); ++i)
      parse_pre_tokenizer(r, list[i], at + ".pretokenizers[" + std::to_string(i) + "]", tok);
    return;
  }
  if (type == "Split") {
    st.kind = K::kSplit;
    r.get_pattern(p, at, &st.literal, &st.regex);
    st.behavior = parse_behavior(r, p, at);
    st.invert = r.get_bool(p, "invert", at, false);
    tok.pre_tokenizers.push_back(std::move(st));
  } else if (type == "ByteLevel") {
    st.kind = K::kByteLevel;
    st.add_prefix_space = r.get_bool(p, "add_prefix_space", at, true);
    tok.pre_tokenizers.push_back(st);
    if (r.get_bool(p, "use_regex", at, true)) {
      PreTokenizerStep split;
      split.kind = K::kSplit;
      split.regex = regex(kGpt2Pattern);
      tok.pre_tokenizers.push_back(std::move(split));
    }
    tok.byte_level = true;
  } else if (type == "Metaspace") {
    st.kind = K::kMetaspace;
    std::string rep = r.get_string(p, "replacement", at);
    if (rep.empty()) r.fail(at + ".replacement", "must be one character");
    st.replacement = rep;
    st.prepend = parse_prepend_scheme(r, p, at);
    st.split = r.get_bool(p, "split", at, true);
    tok.pre_tokenizers.push_back(std::move(st));
  } else if (type == "Digits") {
    st.kind = K::kSplit;
    st.regex = regex(R"(\p{N})");
    st.behavior = r.get_bool(p, "individual_digits", at, false) ? SplitBehavior::kIsolated : SplitBehavior::kContiguous;
    tok.pre_tokenizers.push_back(std::move(st));
  } else if (type == "WhitespaceSplit") {
    st.kind = K::kSplit;
    st.regex = regex(R"(\s+)");
    st.behavior = SplitBehavior::kRemoved;
    tok.pre_tokenizers.push_back(std::move(st));
  } else if (type == "Whitespace") {
    st.kind = K::kSplit;
    st.regex = regex(R"(\w+|[^\w\s]+)");
    st.behavior = SplitBehavior::kRemoved;
    st.invert = true;
    tok.pre_tokenizers.push_back(std::move(st));
  } else {
    r.fail(at + ".type", "'" + type +
                             "' is not supported (supported: Split, ByteLevel, Metaspace, Digits, Whitespace, "
                             "WhitespaceSplit, Sequence)");
  }
}

void parse_decoder(const JsonReader& r, const json& d, const std::string& at, std::vector<DecoderStep>& out) {
  if (d.is_null()) return;
  std::string type = type_of(r, d, at);
  using K = DecoderStep::Kind;
  DecoderStep st{};
  if (type == "Sequence") {
    const json& list = r.require(d, "decoders", at);
    if (!list.is_array()) r.fail(at + ".decoders", "must be an array");
    for (size_t i = 0; i < list.size(); ++i) parse_decoder(r, list[i], at + ".decoders[" + std::to_string(i) + "]", out);
    return;
  }
  if (type == "ByteLevel") st.kind = K::kByteLevel;
  else if (type == "ByteFallback") st.kind = K::kByteFallback;
  else if (type == "Fuse") st.kind = K::kFuse;
  else if (type == "Strip") {
    st.kind = K::kStrip;
    std::string content = r.get_string(d, "content", at);
    char32_t cp = 0;
    if (content.empty() || size_t(utf8_decode(content, 0, &cp)) != content.size())
      r.fail(at + ".content", "must be one character");
    st.strip_char = cp;
    const json& start = r.require(d, "start", at);
    const json& stop = r.require(d, "stop", at);
    if (!start.is_number_unsigned() || !stop.is_number_unsigned()) r.fail(at, "start and stop must be counts");
    st.strip_start = start.get<size_t>();
    st.strip_stop = stop.get<size_t>();
  } else if (type == "Replace") {
    st.kind = K::kReplace;
    r.get_pattern(d, at, &st.pattern, &st.regex);
    st.content = r.get_string(d, "content", at);
  } else if (type == "Metaspace") {
    st.kind = K::kMetaspace;
    st.replacement = r.get_string(d, "replacement", at);
    st.metaspace_prepend = parse_prepend_scheme(r, d, at) != PreTokenizerStep::Prepend::kNever;
  } else {
    r.fail(at + ".type", "'" + type +
                             "' is not supported (supported: ByteLevel, ByteFallback, Fuse, Strip, Replace, Metaspace, "
                             "Sequence)");
  }
  out.push_back(std::move(st));
}

void parse_post_processor(const JsonReader& r, const json& p, const std::string& at, BpeTokenizer& tok) {
  if (p.is_null()) return;
  std::string type = type_of(r, p, at);
  if (type == "Sequence") {
    const json& list = r.require(p, "processors", at);
    if (!list.is_array()) r.fail(at + ".processors", "must be an array");
    for (size_t i = 0; i < list.size(); ++i)
      parse_post_processor(r, list[i], at + ".processors[" + std::to_string(i) + "]", tok);
    return;
  }
  if (type == "ByteLevel") return;  // offsets only
  if (type != "TemplateProcessing")
    r.fail(at + ".type", "'" + type + "' is not supported (supported: TemplateProcessing, ByteLevel, Sequence)");
  const json& single = r.require(p, "single", at);
  const json& specials = r.require(p, "special_tokens", at);
  if (!single.is_array()) r.fail(at + ".single", "must be an array");
  bool seen_sequence = false;
  for (size_t i = 0; i < single.size(); ++i) {
    std::string item_at = at + ".single[" + std::to_string(i) + "]";
    const json& item = single[i];
    if (item.is_object() && item.contains("Sequence")) {
      seen_sequence = true;
      continue;
    }
    if (!item.is_object() || !item.contains("SpecialToken")) r.fail(item_at, "must be {\"SpecialToken\"} or {\"Sequence\"}");
    std::string name = r.get_string(item["SpecialToken"], "id", item_at + ".SpecialToken");
    const json& entry = r.require(specials, name, at + ".special_tokens");
    const json& ids = r.require(entry, "ids", at + ".special_tokens." + name);
    if (!ids.is_array()) r.fail(at + ".special_tokens." + name + ".ids", "must be an array of ids");
    for (const json& id : ids) {
      if (!id.is_number_integer()) r.fail(at + ".special_tokens." + name + ".ids", "must be an array of ids");
      (seen_sequence ? tok.template_suffix : tok.template_prefix).push_back(id.get<int32_t>());
    }
  }
}

int32_t vocab_id(const JsonReader& r, const BpeTokenizer& tok, const std::string& token, const std::string& at) {
  auto it = tok.vocab.find(token);
  if (it == tok.vocab.end()) r.fail(at, "token '" + token + "' is not in the vocabulary");
  return it->second;
}

void add_merge(const JsonReader& r, BpeTokenizer& tok, const std::string& a, const std::string& b, int32_t rank,
               const std::string& at) {
  int32_t left = vocab_id(r, tok, a, at);
  int32_t right = vocab_id(r, tok, b, at);
  size_t prefix = tok.continuing_subword_prefix.size();
  std::string merged = a + (b.compare(0, prefix, tok.continuing_subword_prefix) == 0 ? b.substr(prefix) : b);
  int32_t id = vocab_id(r, tok, merged, at + " (merged)");
  tok.merges.insert(left, right, rank, id);
}

void parse_model(const JsonReader& r, const json& m, BpeTokenizer& tok) {
  if (!m.is_object()) r.fail("model", "must be an object");
  auto type_it = m.find("type");
  std::string type = type_it != m.end() && type_it->is_string() ? type_it->get<std::string>() : "BPE";
  if (type_it == m.end() && !m.contains("merges")) r.fail("model.type", "missing");
  if (type != "BPE")
    r.fail("model.type", "'" + type + "' is not supported (ktune reads BPE tokenizer.json files; for Unigram models "
                                      "load the SentencePiece tokenizer.model instead)");
  const json& vocab = r.require(m, "vocab", "model");
  if (!vocab.is_object()) r.fail("model.vocab", "must be an object of token: id");
  tok.vocab.reserve(vocab.size());
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 || it.value().get<int64_t>() > INT32_MAX)
      r.fail("model.vocab." + it.key(), "must be a non-negative integer id");
    tok.vocab.emplace(it.key(), it.value().get<int32_t>());
  }
  tok.continuing_subword_prefix = r.get_optional_string(m, "continuing_subword_prefix", "model").value_or("");
  tok.end_of_word_suffix = r.get_optional_string(m, "end_of_word_suffix", "model").value_or("");
  tok.ignore_merges = r.get_bool(m, "ignore_merges", "model", false);
  tok.byte_fallback = r.get_bool(m, "byte_fallback", "model", false);
  tok.fuse_unk = r.get_bool(m, "fuse_unk", "model", false);
  if (auto unk = r.get_optional_string(m, "unk_token", "model")) tok.unk_id = vocab_id(r, tok, *unk, "model.unk_token");
  const json& merges = r.require(m, "merges", "model");
  if (!merges.is_array()) r.fail("model.merges", "must be an array");
  for (size_t i = 0; i < merges.size(); ++i) {
    std::string at = "model.merges[" + std::to_string(i) + "]";
    const json& e = merges[i];
    if (e.is_string()) {
      const std::string& s = e.get_ref<const std::string&>();
      size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
        r.fail(at, "'" + s + "' must be two tokens separated by one space");
      add_merge(r, tok, s.substr(0, space), s.substr(space + 1), int32_t(i), at);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      add_merge(r, tok, e[0].get<std::string>(), e[1].get<std::string>(), int32_t(i), at);
    } else {
      r.fail(at, "must be \"a b\" or [\"a\", \"b\"]");
    }
  }
}

void parse_added_tokens(const JsonReader& r, const json& list, BpeTokenizer& tok) {
  if (list.is_null()) return;
  if (!list.is_array()) r.fail("added_tokens", "must be an array");
  for (size_t i = 0; i < list.size(); ++i) {
    std::string at = "added_tokens[" + std::to_string(i) + "]";
    const json& t = list[i];
    AddedToken a;
    a.content = r.get_string(t, "content", at);
    const json& id = r.require(t, "id", at);
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
      r.fail(at + ".id", "must be a non-negative integer");
    a.id = id.get<int32_t>();
    a.single_word = r.get_bool(t, "single_word", at, false);
    a.lstrip = r.get_bool(t, "lstrip", at, false);
    a.rstrip = r.get_bool(t, "rstrip", at, false);
    a.special = r.get_bool(t, "special", at, false);
    a.normalized = r.get_bool(t, "normalized", at, !a.special);
    tok.added_tokens.push_back(std::move(a));
  }
}

const std::string qwen2_added_token_list[] = {
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"};

}  // namespace

std::string read_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path, "cannot open the file (does it exist and is it readable?)");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

json read_json_file(const std::string& path) { return JsonReader(path).parse(read_file_bytes(path)); }

SpecialTokenNames read_tokenizer_config(const std::string& path) {
  SpecialTokenNames names;
  if (path.empty()) return names;
  JsonReader r(path);
  json config = read_json_file(path);
  if (!config.is_object()) r.fail("", "must be a JSON object");
  auto read = [&](const char* key, SpecialTokenNames::Name& name) {
    auto it = config.find(key);
    if (it == config.end()) return;
    name.set = true;
    if (it->is_null()) return;
    if (it->is_string()) name.token = it->get<std::string>();
    else if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
      name.token = (*it)["content"].get<std::string>();
    else r.fail(key, "must be a token string, {\"content\": …} or null");
  };
  read("bos_token", names.bos);
  read("eos_token", names.eos);
  read("pad_token", names.pad);
  return names;
}

void resolve_special_ids(BpeTokenizer& tok, const std::string& config_path) {
  SpecialTokenNames names = read_tokenizer_config(config_path);
  auto lookup = [&](const SpecialTokenNames::Name& name, const char* key) -> std::optional<int32_t> {
    if (!name.token) return std::nullopt;
    auto id = tok.token_to_id(*name.token);
    if (!id) throw Error(config_path + ": " + key, "token '" + *name.token + "' is not in the tokenizer's vocabulary");
    return id;
  };
  auto first_known = [&](std::initializer_list<const char*> candidates) -> std::optional<int32_t> {
    for (const char* c : candidates)  // added tokens only: "<s>" may be an ordinary word piece
      if (auto id = tok.token_to_id(c); id && tok.is_added(*id)) return id;
    return std::nullopt;
  };
  if (names.bos.set) tok.bos = lookup(names.bos, "bos_token");
  else if (!tok.template_prefix.empty()) tok.bos = tok.template_prefix.front();
  else tok.bos = first_known({"<|begin_of_text|>", "<s>", "<bos>"});
  if (names.eos.set) tok.eos = lookup(names.eos, "eos_token");
  else if (!tok.template_suffix.empty()) tok.eos = tok.template_suffix.back();
  else tok.eos = first_known({"<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>"});
  if (names.pad.set) tok.pad = lookup(names.pad, "pad_token");
  else tok.pad = first_known({"<|finetune_right_pad_id|>", "<pad>", "<|pad|>", "[PAD]", "<|endoftext|>"});
}

std::unique_ptr<Tokenizer> load_hf_tokenizer_json(const std::string& path, const std::string& config_path,
                                                  const json* parsed) {
  JsonReader r(path);
  json own;
  if (!parsed) own = r.parse(read_file_bytes(path));
  const json& j = parsed ? *parsed : own;
  if (!j.is_object()) r.fail("", "must be a JSON object");
  auto tok = std::make_unique<BpeTokenizer>();
  tok->source = path;
  parse_model(r, r.require(j, "model", ""), *tok);
  if (j.contains("normalizer")) parse_normalizer(r, j.at("normalizer"), "normalizer", tok->normalizers);
  if (j.contains("pre_tokenizer")) parse_pre_tokenizer(r, j.at("pre_tokenizer"), "pre_tokenizer", *tok);
  if (tok->byte_level && !tok->continuing_subword_prefix.empty())
    r.fail("model.continuing_subword_prefix", "is not supported together with a ByteLevel pre-tokenizer");
  if (j.contains("decoder") && !j.at("decoder").is_null()) {
    tok->has_decoder = true;
    parse_decoder(r, j.at("decoder"), "decoder", tok->decoders);
  }
  if (j.contains("post_processor")) parse_post_processor(r, j.at("post_processor"), "post_processor", *tok);
  if (j.contains("added_tokens")) parse_added_tokens(r, j.at("added_tokens"), *tok);
  tok->finalize();
  resolve_special_ids(*tok, config_path);
  return tok;
}

std::unique_ptr<Tokenizer> load_vocab_merges_tokenizer(const std::string& vocab_path, const std::string& merges_path,
                                                       const std::string& config_path, const json* parsed) {
  JsonReader r(vocab_path);
  json own;
  if (!parsed) own = r.parse(read_file_bytes(vocab_path));
  const json& vocab = parsed ? *parsed : own;
  if (!vocab.is_object()) r.fail("", "must be a JSON object of token: id (a vocab.json)");
  auto tok = std::make_unique<BpeTokenizer>();
  tok->source = vocab_path;
  int32_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 || it.value().get<int64_t>() > INT32_MAX)
      r.fail(it.key(), "must be a non-negative integer id");
    tok->vocab.emplace(it.key(), it.value().get<int32_t>());
    max_id = std::max(max_id, it.value().get<int32_t>());
  }
  std::ifstream merges(merges_path, std::ios::binary);
  if (!merges) throw Error(merges_path, "cannot open the merges file (vocab.json needs merges.txt beside it, or --merges)");
  JsonReader mr(merges_path);
  std::string line;
  int32_t rank = 0;
  for (size_t line_no = 1; std::getline(merges, line); ++line_no) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.rfind("#version", 0) == 0 || line.empty()) continue;
    size_t space = line.find(' ');
    std::string at = "line " + std::to_string(line_no);
    if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos)
      mr.fail(at, "'" + line + "' must be two tokens separated by one space");
    add_merge(mr, *tok, line.substr(0, space), line.substr(space + 1), rank++, at);
  }
  tok->normalizers.push_back(NormalizerStep{NormalizerStep::Kind::kNfc, {}, nullptr, {}, false, false});
  PreTokenizerStep split;
  split.kind = PreTokenizerStep::Kind::kSplit;
  split.regex = std::make_shared<Pcre2Regex>(kQwen2Pattern, "Qwen2 split pattern");
  tok->pre_tokenizers.push_back(std::move(split));
  PreTokenizerStep byte_level;
  byte_level.kind = PreTokenizerStep::Kind::kByteLevel;
  tok->pre_tokenizers.push_back(std::move(byte_level));
  tok->byte_level = true;
  tok->has_decoder = true;
  tok->decoders.push_back(DecoderStep{DecoderStep::Kind::kByteLevel});

  // Special tokens: tokenizer_config.json's added_tokens_decoder when given, else torchtune's list.
  bool from_config = false;
  if (!config_path.empty()) {
    JsonReader cr(config_path);
    json config = cr.parse(read_file_bytes(config_path));
    if (config.is_object() && config.contains("added_tokens_decoder")) {
      const json& dec = config["added_tokens_decoder"];
      if (!dec.is_object()) cr.fail("added_tokens_decoder", "must be an object of id: token");
      for (auto it = dec.begin(); it != dec.end(); ++it) {
        std::string at = "added_tokens_decoder." + it.key();
        AddedToken a;
        try {
          a.id = std::stoi(it.key());
        } catch (const std::exception&) {
          cr.fail(at, "the key must be an integer id");
        }
        a.content = cr.get_string(it.value(), "content", at);
        a.single_word = cr.get_bool(it.value(), "single_word", at, false);
        a.lstrip = cr.get_bool(it.value(), "lstrip", at, false);
        a.rstrip = cr.get_bool(it.value(), "rstrip", at, false);
        a.special = cr.get_bool(it.value(), "special", at, false);
        a.normalized = cr.get_bool(it.value(), "normalized", at, !a.special);
        tok->added_tokens.push_back(std::move(a));
      }
      from_config = true;
    }
  }
  if (!from_config) {
    int32_t next = max_id + 1;
    for (const std::string& content : qwen2_added_token_list) {
      AddedToken a;
      a.content = content;
      a.id = next++;
      // As Qwen's tokenizer.json: the tool-call and fill-in-the-middle markers are added, not special.
      a.special = a.id - (max_id + 1) < 14;
      a.normalized = false;
      tok->added_tokens.push_back(std::move(a));
    }
  }
  tok->finalize();
  // torchtune's Qwen2 / Qwen2.5 tokenizer: no BOS, EOS <|im_end|> (its __init__'s eos_token default;
  // the docstring's <|endoftext|> is not what runs), PAD <|endoftext|> — unless the config says otherwise.
  resolve_special_ids(*tok, config_path);
  SpecialTokenNames names = read_tokenizer_config(config_path);
  if (!names.bos.set) tok->bos.reset();
  if (!names.eos.set) tok->eos = tok->token_to_id("<|im_end|>");
  if (!names.pad.set) tok->pad = tok->token_to_id("<|endoftext|>");
  return tok;
}

}  // namespace ktune::text
