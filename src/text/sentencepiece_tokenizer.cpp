// SentencePiece tokenizer.model (Gemma, Mistral, Llama 2) through Debian's libsentencepiece, behind
// the Tokenizer interface. Control pieces (<s>, </s>, <bos>, <eos>, …) written in the text are
// matched as tokens before SentencePiece sees it (as HF does for special tokens), and each plain
// stretch between them is encoded on its own (so each gets SentencePiece's dummy-prefix rule).
// It deliberately adds nothing to SentencePiece's own normalisation or segmentation.
#include <sentencepiece_processor.h>

#include "core/error.h"
#include "text/added_tokens.h"
#include "text/tokenizer_formats.h"
#include "text/unicode_text.h"

namespace ktune::text {

namespace {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(const std::string& path, const std::string& config_path) : source_(path) {
    read_file_bytes(path);  // a clear error for a missing file
    auto status = sp_.Load(path);
    if (!status.ok())
      throw Error(path, "not a tokenizer.json, vocab.json, tiktoken rank file or SentencePiece model (" +
                            status.ToString() + ")");
    const int n = sp_.GetPieceSize();
    for (int id = 0; id < n; ++id) {
      if (!sp_.IsControl(id)) continue;
      std::string piece = sp_.IdToPiece(id);
      AddedToken t;
      t.content = piece;
      t.id = id;
      control_.add(piece, t);
    }
    auto opt = [](int id) { return id >= 0 ? std::optional<int32_t>(id) : std::nullopt; };
    bos_ = opt(sp_.bos_id());
    eos_ = opt(sp_.eos_id());
    pad_ = opt(sp_.pad_id());
    SpecialTokenNames names = read_tokenizer_config(config_path);
    auto lookup = [&](const SpecialTokenNames::Name& name, const char* key, std::optional<int32_t>& out) {
      if (!name.set) return;
      out.reset();
      if (!name.token) return;
      out = token_to_id(*name.token);
      if (!out) throw Error(config_path + ": " + key, "token '" + *name.token + "' is not in the SentencePiece model");
    };
    lookup(names.bos, "bos_token", bos_);
    lookup(names.eos, "eos_token", eos_);
    lookup(names.pad, "pad_token", pad_);
  }

  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool add_eos) const override {
    require_valid_utf8(text, source_ + ": text to encode");
    std::vector<int32_t> ids;
    if (add_bos && bos_) ids.push_back(*bos_);
    std::vector<TextSegment> segments;
    control_.split(text, segments);
    std::vector<int> piece_ids;
    for (const TextSegment& s : segments) {
      if (s.id >= 0) {
        ids.push_back(s.id);
        continue;
      }
      auto status = sp_.Encode(text.substr(s.begin, s.end - s.begin), &piece_ids);
      if (!status.ok()) throw Error(source_, "SentencePiece encode failed: " + status.ToString());
      ids.insert(ids.end(), piece_ids.begin(), piece_ids.end());
    }
    if (add_eos && eos_) ids.push_back(*eos_);
    return ids;
  }

  // SentencePiece itself never matches control pieces in text.
  std::vector<int32_t> encode_ordinary(std::string_view text) const override {
    require_valid_utf8(text, source_ + ": text to encode");
    std::vector<int> piece_ids;
    auto status = sp_.Encode(text, &piece_ids);
    if (!status.ok()) throw Error(source_, "SentencePiece encode failed: " + status.ToString());
    return std::vector<int32_t>(piece_ids.begin(), piece_ids.end());
  }

  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const override {
    std::string out, piece;
    std::vector<int> run;
    auto flush = [&] {
      if (run.empty()) return;
      auto status = sp_.Decode(run, &piece);
      if (!status.ok()) throw Error(source_, "SentencePiece decode failed: " + status.ToString());
      out += piece;
      run.clear();
    };
    const int n = sp_.GetPieceSize();
    for (int32_t id : ids) {
      if (id < 0 || id >= n)
        throw Error(source_, "cannot decode id " + std::to_string(id) + ": outside the vocabulary [0, " +
                                 std::to_string(n) + ")");
      if (sp_.IsControl(id)) {
        flush();
        if (!skip_special) out += sp_.IdToPiece(id);
        continue;
      }
      run.push_back(id);
    }
    flush();
    return out;
  }

  int32_t vocab_size() const override { return sp_.GetPieceSize(); }
  std::optional<int32_t> bos_id() const override { return bos_; }
  std::optional<int32_t> eos_id() const override { return eos_; }
  std::optional<int32_t> pad_id() const override { return pad_; }
  std::optional<int32_t> token_to_id(std::string_view token) const override {
    int id = sp_.PieceToId(token);
    if (id < 0 || sp_.IdToPiece(id) != token) return std::nullopt;
    return id;
  }
  std::string id_to_token(int32_t id) const override {
    if (id < 0 || id >= sp_.GetPieceSize()) throw Error(source_, "id " + std::to_string(id) + " is outside the vocabulary");
    return sp_.IdToPiece(id);
  }
  bool is_special(int32_t id) const override { return id >= 0 && id < sp_.GetPieceSize() && sp_.IsControl(id); }

 private:
  std::string source_;
  sentencepiece::SentencePieceProcessor sp_;
  AddedTokenMatcher control_;
  std::optional<int32_t> bos_, eos_, pad_;
};

}  // namespace

std::unique_ptr<Tokenizer> load_sentencepiece_tokenizer(const std::string& path, const std::string& config_path) {
  return std::make_unique<SentencePieceTokenizer>(path, config_path);
}

}  // namespace ktune::text
