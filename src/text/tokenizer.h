// The one tokenizer interface every format implements (HF tokenizer.json BPE, Qwen vocab.json +
// merges.txt, Llama 3 tiktoken tokenizer.model, SentencePiece tokenizer.model), and the loader
// that picks the implementation from the file. Prompt and chat formats (text/chat_format.h) and the
// dataset builders (data/) see only this interface.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ktune {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Text → ids. Added/special tokens in the text are matched as such (as HF tokenizers do).
  // add_bos / add_eos prepend / append the model's BOS / EOS where the model has them.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_bos = false, bool add_eos = false) const = 0;
  // Text → ids with special tokens written in the text encoded as ordinary text: what torchtune's
  // tiktoken and SentencePiece tokenizers do to message content, and HF's split_special_tokens=True
  // (non-special added tokens still match). Implementations that have special tokens override it.
  virtual std::vector<int32_t> encode_ordinary(std::string_view text) const { return encode(text); }
  // Ids → text; skip_special drops special tokens (BOS, EOS, chat headers).
  virtual std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const = 0;

  virtual int32_t vocab_size() const = 0;  // the largest id + 1, special tokens included
  virtual std::optional<int32_t> bos_id() const = 0;
  virtual std::optional<int32_t> eos_id() const = 0;
  virtual std::optional<int32_t> pad_id() const = 0;
  // The id of a whole token given by its text ("<|eot_id|>", "<|im_start|>"), if it exists.
  virtual std::optional<int32_t> token_to_id(std::string_view token) const = 0;
  virtual std::string id_to_token(int32_t id) const = 0;
  virtual bool is_special(int32_t id) const = 0;
};

struct TokenizerOptions {
  std::string path;          // tokenizer.json, tokenizer.model, or vocab.json
  std::string merges_file;   // merges.txt beside vocab.json (Qwen, as torchtune's qwen2 tokenizer)
  std::string config_path;   // optional tokenizer_config.json (special tokens, BOS/EOS names)
};

// Picks the implementation from the file's content: a tokenizer.json, a tiktoken rank file,
// a SentencePiece model, or vocab.json + merges.txt. Errors name the file and what is wrong.
std::unique_ptr<Tokenizer> load_tokenizer(const TokenizerOptions& options);

// The tokenizer_config.json in the tokenizer file's folder, as AutoTokenizer reads it with the
// tokenizer ("" when there is none). The CLI's tokenize and generate take it unless --config says
// another; the recipes' tokenizer builders keep torchtune's own rules.
std::string tokenizer_config_beside(const std::string& tokenizer_path);

}  // namespace ktune
