// The loaders behind load_tokenizer, one per file format, and the rule that names a tokenizer's
// BOS / EOS / PAD. Internal to the text layer (tests use them to force a format); everything else
// goes through load_tokenizer. Each loader's errors name the file and the key or line at fault.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "text/tokenizer.h"

namespace ktune::text {

class BpeTokenizer;

// HF tokenizer.json (BPE model). `parsed`: the file's JSON when the caller has already parsed it.
std::unique_ptr<Tokenizer> load_hf_tokenizer_json(const std::string& path, const std::string& config_path,
                                                  const nlohmann::json* parsed = nullptr);
// vocab.json + merges.txt with Qwen2's pipeline (NFC, Qwen2's split regex, byte-level) and its
// special tokens after the vocabulary (from tokenizer_config.json's added_tokens_decoder if given,
// else torchtune's Qwen2.5 list: <|endoftext|>, <|im_start|>, <|im_end|>, …).
std::unique_ptr<Tokenizer> load_vocab_merges_tokenizer(const std::string& vocab_path, const std::string& merges_path,
                                                       const std::string& config_path,
                                                       const nlohmann::json* parsed = nullptr);
// Llama 3's tiktoken rank file (base64 token, rank per line) with Llama 3's split regex and its 256
// special tokens from the first id after the ranks (Meta's names: <|begin_of_text|>, …, <|eot_id|>).
std::unique_ptr<Tokenizer> load_tiktoken_tokenizer(const std::string& path, const std::string& config_path);
// A SentencePiece model through libsentencepiece.
std::unique_ptr<Tokenizer> load_sentencepiece_tokenizer(const std::string& path, const std::string& config_path);

// tokenizer_config.json's bos_token / eos_token / pad_token: `set` when the key is present
// (a null value then means "none"); a string or an {"content": …} object names the token.
struct SpecialTokenNames {
  struct Name {
    bool set = false;
    std::optional<std::string> token;
  };
  Name bos, eos, pad;
};
SpecialTokenNames read_tokenizer_config(const std::string& path);

// BOS/EOS/PAD for the BPE tokenizers: the config when it names them; else TemplateProcessing's
// tokens around $A (BOS before, EOS after); else the first known name among the added tokens —
// BOS <|begin_of_text|> <s> <bos>; EOS <|end_of_text|> <|endoftext|> </s> <eos>;
// PAD <|finetune_right_pad_id|> <pad> <|pad|> [PAD], then <|endoftext|> (Qwen's pad).
void resolve_special_ids(BpeTokenizer& tokenizer, const std::string& config_path);

// The file's content, or Error(path, "cannot read …").
std::string read_file_bytes(const std::string& path);
// The file parsed as JSON, or Error(path, "not valid JSON: …").
nlohmann::json read_json_file(const std::string& path);

}  // namespace ktune::text
