// Messages → token ids plus a per-token mask (1 = do not train), the way torchtune 0.6.1's model
// tokenizers do it in tokenize_messages, for each family's chat format:
//   kLlama3   <|begin_of_text|> then per message <|start_header_id|>role<|end_header_id|>\n\n
//             body.strip() <|eot_id|> (or <|eom_id|>), then <|end_of_text|>   (Llama3Tokenizer)
//   kChatML   per message <|im_start|>role\n content <|im_end|>\n, the last assistant message
//             left open and closed by the EOS (= <|im_end|>)                 (Qwen2_5Tokenizer)
//   kMistral  MistralChatTemplate "[INST] … [/INST] " through tokenize_messages_no_special_tokens:
//             BOS at each new turn, EOS after each assistant message          (MistralTokenizer)
//   kGemma    <bos> then <start_of_turn>user\n … <end_of_turn>\n, <start_of_turn>model\n …
//             <end_of_turn>\n, a system prompt folded into the first user turn as Gemma's HF chat
//             template does, then EOS. torchtune has no Gemma turn format; this one follows the
//             HF template and torchtune's masking rules (a message's header and footer share its
//             mask; the final EOS takes the last message's).
//   kPlain    tokenize_messages_no_special_tokens with no template (torchtune's Gemma/Llama 2
//             tokenizers without a prompt_template)
//   kTemplate the model's own Jinja chat template (text/hf_chat_template.h), rendered as
//             transformers' apply_chat_template does: the ids are that text's (the very ids
//             transformers and vLLM prompt with); each token takes the mask of the message whose
//             rendering added it (the conversation rendered message by message, the boundaries
//             where each prefix's ids end, as torchtune's HuggingFaceModelTokenizer finds them);
//             the EOS is appended only where the text does not already end with it; the generation
//             prompt is rendered only when asking (add_end_tokens = false). See tokenize_template.
// Whole messages share the message's mask (so an assistant header is trained on, as in torchtune).
// Truncation to max_seq_len is torchtune's: stop adding messages once the length reaches it, cut,
// and put the end token (and its mask value) in the last place when end tokens are on.
//
// Special-token text inside content ("<|eot_id|>" typed in a row) is encoded as plain text
// (Tokenizer::encode_ordinary) by every format but ChatML, as torchtune's tiktoken and
// SentencePiece tokenizers do; Qwen's matches it as the special token, and so does kChatML.
//
// Deliberately not here: which columns become messages (data/), images, tool-call parsing.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "text/hf_chat_template.h"
#include "text/prompt_template.h"
#include "text/tokenizer.h"

namespace ktune {

enum class ChatFormatKind { kLlama3, kChatML, kMistral, kGemma, kPlain, kTemplate };

// Which end a sequence longer than max_seq_len keeps (torchtune's truncation_type).
enum class Truncation { kRight, kLeft };

// "llama3" (also llama3_1, llama3_2, llama3_3), "chatml" (also qwen2, qwen2_5, qwen3), "mistral",
// "gemma" (also gemma2), "plain" (also llama2). Throws ktune::Error naming the accepted names.
ChatFormatKind parse_chat_format(std::string_view name);
std::string chat_format_name(ChatFormatKind kind);
// The format torchtune's tokenizer builder implies: torchtune.models.llama3*.llama3*_tokenizer →
// kLlama3, qwen2/qwen2_5 → kChatML, mistral → kMistral, gemma/gemma2 and llama2 → kPlain (torchtune
// applies no Gemma turn template; ask for "gemma" explicitly to get one). nullopt if unknown.
std::optional<ChatFormatKind> chat_format_for_tokenizer_component(std::string_view component);
// From the tokenizer's special tokens: <|start_header_id|> → Llama 3, <|im_start|> → ChatML,
// <start_of_turn> → Gemma, [INST] → Mistral, otherwise plain.
ChatFormatKind detect_chat_format(const Tokenizer& tokenizer);

struct TokenizedMessages {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;  // 1 where the token is not trained on (torchtune's mask=True)
  bool truncated = false;     // the messages did not fit in max_seq_len
};

// torchtune.data.truncate: the first max_seq_len items; when end is given, the last item is set
// to it (even when nothing was cut, as torchtune does).
template <typename T>
void truncate_torchtune(std::vector<T>& items, int64_t max_seq_len, const std::optional<T>& end) {
  if ((int64_t)items.size() > max_seq_len) items.resize((size_t)max_seq_len);
  if (end && !items.empty() && items.back() != *end) items.back() = *end;
}

class ChatFormat {
 public:
  // The tokenizer must outlive the format. max_seq_len <= 0 means no limit. A prompt_template
  // (torchtune's custom tags) is applied before tokenising; kMistral has its own by default.
  ChatFormat(const Tokenizer& tokenizer, ChatFormatKind kind, int64_t max_seq_len = 0,
             std::optional<PromptTemplate> prompt_template = std::nullopt);
  // kTemplate: the model's chat template. eos: the id appended after a conversation (the
  // tokenizer's EOS unless the model's generation config names another); nullopt: none.
  ChatFormat(const Tokenizer& tokenizer, HfChatTemplate chat_template, std::optional<int32_t> eos, int64_t max_seq_len = 0,
             Truncation truncation = Truncation::kRight);

  // add_end_tokens = false for generation (no EOS, last turn left open where the format allows).
  // tools: the tool schemas offered to the model (a JSON list, or null for none), and messages'
  // tool_calls (Message::source): only a model's own chat template renders them; the family
  // formats (torchtune's tokenizers, which have no place for them) refuse both.
  TokenizedMessages tokenize(const std::vector<Message>& messages, bool add_end_tokens = true,
                             const nlohmann::ordered_json& tools = nullptr) const;

  // Text → ids the way this format's torchtune tokenizer encodes a text column (text completion):
  // plain for all but ChatML, with the tokenizer's BOS / EOS when asked (Llama 3: nothing at all
  // for empty text, as torchtune's tiktoken wrapper does).
  std::vector<int32_t> encode_text(std::string_view text, bool add_bos, bool add_eos) const;

  ChatFormatKind kind() const { return kind_; }
  int64_t max_seq_len() const { return max_seq_len_; }
  const Tokenizer& tokenizer() const { return tokenizer_; }

 private:
  TokenizedMessages tokenize_llama3(const std::vector<Message>& messages, bool add_end_tokens) const;
  TokenizedMessages tokenize_chatml(const std::vector<Message>& messages, bool add_end_tokens) const;
  TokenizedMessages tokenize_gemma(const std::vector<Message>& messages, bool add_end_tokens) const;
  TokenizedMessages tokenize_no_special_tokens(const std::vector<Message>& messages, bool add_end_tokens) const;
  TokenizedMessages tokenize_template(const std::vector<Message>& messages, bool add_end_tokens,
                                      const nlohmann::ordered_json& tools) const;
  std::vector<int32_t> encode(std::string_view text) const;
  // SentencePieceBaseTokenizer.encode(trim_leading_whitespace=True): encode "\n" + text and drop
  // the ids of "\n", so that no dummy-prefix space is added in the middle of a turn.
  std::vector<int32_t> encode_trimmed(std::string_view text) const;
  int32_t special(const char* token) const;

  const Tokenizer& tokenizer_;
  ChatFormatKind kind_;
  int64_t max_seq_len_;
  std::optional<PromptTemplate> prompt_template_;
  std::optional<HfChatTemplate> chat_template_;  // kTemplate
  std::optional<int32_t> template_eos_;          // kTemplate
  Truncation truncation_ = Truncation::kRight;
  bool encodes_whitespace_ = true;
  std::vector<int32_t> newline_ids_;
};

}  // namespace ktune
