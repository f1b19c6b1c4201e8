// BpeTokenizer: the one BPE pipeline behind HF tokenizer.json, Qwen's vocab.json + merges.txt and
// Llama 3's tiktoken file — added tokens → normaliser → pre-tokeniser → BPE model → post-processor,
// and the decoder chain back — with HF tokenizers' semantics (the loaders in tokenizer_formats.h
// fill it in). Byte-level vocabularies (a ByteLevel pre-tokeniser) run on raw bytes: the vocabulary
// is re-keyed by the bytes each token stands for, so no text is ever mapped to 'Ġ' characters.
// It deliberately does not read files; it supports the components listed in the enums below and
// the loaders reject the others by name.
#pragma once

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "text/added_tokens.h"
#include "text/bpe_merges.h"
#include "text/pcre2_regex.h"
#include "text/tokenizer.h"
#include "text/unicode_text.h"

namespace ktune::text {

struct NormalizerStep {
  enum class Kind { kNfc, kNfd, kNfkc, kNfkd, kLowercase, kReplace, kPrepend, kStrip } kind;
  std::string pattern;                 // Replace: a literal pattern (when regex is null)
  std::shared_ptr<Pcre2Regex> regex;   // Replace: a Regex pattern
  std::string content;                 // Replace: the replacement; Prepend: the prefix
  bool strip_left = false, strip_right = false;
};

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct PreTokenizerStep {
  enum class Kind { kSplit, kByteLevel, kMetaspace } kind;
  // Split (Digits, Whitespace, WhitespaceSplit and ByteLevel's use_regex are Splits too)
  std::shared_ptr<Pcre2Regex> regex;
  std::string literal;  // a String pattern (when regex is null)
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  // ByteLevel
  bool add_prefix_space = false;
  // Metaspace
  std::string replacement = "\xE2\x96\x81";  // ▁
  enum class Prepend { kAlways, kFirst, kNever } prepend = Prepend::kAlways;
  bool split = true;
};

struct DecoderStep {
  enum class Kind { kByteLevel, kByteFallback, kFuse, kStrip, kReplace, kMetaspace } kind;
  std::string pattern;
  std::shared_ptr<Pcre2Regex> regex;
  std::string content;
  char32_t strip_char = ' ';
  size_t strip_start = 0, strip_stop = 0;
  std::string replacement = "\xE2\x96\x81";
  bool metaspace_prepend = true;
};

class BpeTokenizer final : public Tokenizer {
 public:
  // ---- configuration, filled by a loader, then finalize() ----
  std::string source;  // the file, for messages
  std::vector<NormalizerStep> normalizers;
  std::vector<PreTokenizerStep> pre_tokenizers;
  bool byte_level = false;  // the pre-tokeniser ends with ByteLevel: the model sees raw bytes

  std::unordered_map<std::string, int32_t> vocab;  // as spelled in the file
  MergeTable merges;
  bool ignore_merges = false;
  bool byte_fallback = false;
  bool fuse_unk = false;
  std::optional<int32_t> unk_id;
  std::string continuing_subword_prefix, end_of_word_suffix;

  std::vector<AddedToken> added_tokens;
  std::vector<DecoderStep> decoders;
  bool has_decoder = false;

  std::vector<int32_t> template_prefix, template_suffix;  // TemplateProcessing's single: around $A
  std::optional<int32_t> bos, eos, pad;

  // Builds the lookup tables (id → token, raw-byte vocabulary, added-token matchers).
  void finalize();

  // ---- Tokenizer ----
  std::vector<int32_t> encode(std::string_view text, bool add_bos = false, bool add_eos = false) const override;
  std::vector<int32_t> encode_ordinary(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const override;
  int32_t vocab_size() const override { return vocab_size_; }
  std::optional<int32_t> bos_id() const override { return bos; }
  std::optional<int32_t> eos_id() const override { return eos; }
  std::optional<int32_t> pad_id() const override { return pad; }
  std::optional<int32_t> token_to_id(std::string_view token) const override;
  std::string id_to_token(int32_t id) const override;
  bool is_special(int32_t id) const override;
  bool is_added(int32_t id) const { return id >= 0 && id < vocab_size_ && added_[size_t(id)]; }

  // Applies the normaliser steps (exposed for tests).
  std::string normalize(std::string_view s) const;

 private:
  std::vector<int32_t> encode_with(std::string_view text, bool add_bos, bool add_eos, const AddedTokenMatcher& raw,
                                   const AddedTokenMatcher& normalized) const;
  void encode_segment(std::string_view segment, bool at_start, std::vector<int32_t>& ids) const;
  void pre_tokenize(size_t step, std::string_view piece, bool at_start, std::vector<int32_t>& ids) const;
  void encode_piece(std::string_view piece, std::vector<int32_t>& ids) const;
  void encode_piece_chars(std::string_view piece, std::vector<int32_t>& ids) const;

  int32_t vocab_size_ = 0;
  std::vector<std::string> id_to_token_;
  std::vector<uint8_t> special_;
  std::vector<uint8_t> added_;  // ids that are added tokens
  std::unordered_map<std::string, int32_t> added_by_content_;
  // Byte-level: raw bytes → id, and the id of each single byte (−1 when the vocabulary lacks it).
  struct RawHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
  };
  std::unordered_map<std::string, int32_t, RawHash, std::equal_to<>> raw_vocab_;
  std::unordered_map<std::string, int32_t, RawHash, std::equal_to<>> char_vocab_;  // = vocab, transparent
  std::array<int32_t, 256> byte_ids_{};
  std::array<int32_t, 256> byte_fallback_ids_{};
  AddedTokenMatcher raw_matcher_, normalized_matcher_;
  AddedTokenMatcher raw_ordinary_matcher_, normalized_ordinary_matcher_;  // non-special added tokens only
  PieceCache cache_;
};

}  // namespace ktune::text
