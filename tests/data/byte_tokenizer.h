// A test-only tokenizer whose ids are the text's bytes (0..255) plus a few special tokens from
// 256 on, in four flavours that mirror the stand-ins make_data_fixtures.py builds for torchtune's
// own tokenizer classes, so that the data layer can be compared with torchtune exactly without
// depending on a real vocabulary:
//   kLlama3  torchtune's TikTokenBaseTokenizer over a 256-byte rank file: empty text encodes to
//            nothing (not even BOS/EOS)
// encode() matches special-token text (as ktune's and HF's tokenizers do, SentencePiece aside);
// encode_ordinary() never does (torchtune's tiktoken/SentencePiece content encoding).
//   kQwen    Qwen2_5Tokenizer over a byte vocab.json and no merges: specials matched in text, no
//            BOS, EOS = <|im_end|>
//   kSentencePiece  a SentencePiece with add_dummy_prefix: non-empty text gets a leading "▁"
//            piece (id 258); BOS <s> 256, EOS </s> 257, pad 0 (torchtune sets it so)
//   kGemma   specials <bos> <eos> <start_of_turn> <end_of_turn> <pad>
// It deliberately does no merging: the format logic, not BPE, is under test here.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "text/tokenizer.h"

namespace ktune::testing {

class ByteTokenizer : public Tokenizer {
 public:
  enum class Flavour { kLlama3, kQwen, kSentencePiece, kGemma };

  explicit ByteTokenizer(Flavour flavour) : flavour_(flavour) {
    switch (flavour) {
      case Flavour::kLlama3:
        specials_ = {"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                     "<|eom_id|>", "<|python_tag|>", "<|finetune_right_pad_id|>", "<|step_id|>", "<|image|>"};
        bos_ = 256, eos_ = 257, pad_ = 263;
        break;
      case Flavour::kQwen:
        specials_ = {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"};
        bos_ = -1, eos_ = 258, pad_ = 256;
        break;
      case Flavour::kSentencePiece:
        specials_ = {"<s>", "</s>", "\xE2\x96\x81"};
        bos_ = 256, eos_ = 257, pad_ = 0;
        break;
      case Flavour::kGemma:
        specials_ = {"<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>", "<pad>"};
        bos_ = 256, eos_ = 257, pad_ = 260;
        break;
    }
  }

  std::vector<int32_t> encode(std::string_view text, bool add_bos = false, bool add_eos = false) const override {
    return encode_impl(text, add_bos, add_eos, flavour_ != Flavour::kSentencePiece);
  }
  // Special-token text as plain bytes (what torchtune's tiktoken and SentencePiece wrappers do).
  std::vector<int32_t> encode_ordinary(std::string_view text) const override {
    return encode_impl(text, false, false, false);
  }

  std::vector<int32_t> encode_impl(std::string_view text, bool add_bos, bool add_eos, bool match) const {
    std::vector<int32_t> ids;
    if (flavour_ == Flavour::kLlama3 && text.empty()) return ids;
    if (add_bos && bos_ >= 0) ids.push_back(bos_);
    if (flavour_ == Flavour::kSentencePiece && !text.empty()) ids.push_back(258);
    for (size_t i = 0; i < text.size();) {
      bool matched = false;
      if (match) {
        for (size_t s = 0; s < specials_.size(); ++s) {
          if (text.substr(i, specials_[s].size()) == specials_[s]) {
            ids.push_back(256 + (int32_t)s);
            i += specials_[s].size();
            matched = true;
            break;
          }
        }
      }
      if (!matched) ids.push_back((unsigned char)text[i++]);
    }
    if (add_eos && eos_ >= 0) ids.push_back(eos_);
    return ids;
  }

  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const override {
    std::string out;
    for (int32_t id : ids) {
      if (id < 256) out += (char)id;
      else if (!skip_special) out += id_to_token(id);
    }
    return out;
  }

  int32_t vocab_size() const override { return 256 + (int32_t)specials_.size(); }
  std::optional<int32_t> bos_id() const override { return bos_ >= 0 ? std::optional<int32_t>(bos_) : std::nullopt; }
  std::optional<int32_t> eos_id() const override { return eos_; }
  std::optional<int32_t> pad_id() const override { return pad_; }
  std::optional<int32_t> token_to_id(std::string_view token) const override {
    for (size_t s = 0; s < specials_.size(); ++s)
      if (specials_[s] == token) return 256 + (int32_t)s;
    return std::nullopt;
  }
  std::string id_to_token(int32_t id) const override {
    return id < 256 ? std::string(1, (char)id) : specials_.at((size_t)id - 256);
  }
  bool is_special(int32_t id) const override { return id >= 256; }

 private:
  Flavour flavour_;
  std::vector<std::string> specials_;
  int32_t bos_ = -1, eos_ = -1, pad_ = -1;
};

}  // namespace ktune::testing
