// Chat formats: messages → ids + mask (see chat_format.h). Each tokenize_* mirrors one torchtune
// 0.6.1 function line by line (named in its comment) so that a reader can check them side by
// side; tests/data/fixtures holds torchtune's own output for the same messages.
#include "text/chat_format.h"

#include <algorithm>

#include "core/error.h"
#include "core/log.h"

namespace ktune {

namespace {

// Python's str.isspace() code points (what str.strip() removes).
bool is_python_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Decodes the code point starting at s[i]; returns its length (1 for a stray byte).
int decode_at(std::string_view s, size_t i, char32_t* cp) {
  unsigned char c = (unsigned char)s[i];
  int n = c < 0x80 ? 1 : c < 0xC0 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
  if (i + n > s.size()) n = 1;
  if (n == 1) { *cp = c; return 1; }
  char32_t v = c & (0xFF >> (n + 1));
  for (int k = 1; k < n; ++k) v = (v << 6) | ((unsigned char)s[i + k] & 0x3F);
  *cp = v;
  return n;
}

// Python's str.strip() with no arguments, on UTF-8.
std::string_view python_strip(std::string_view s) {
  size_t begin = 0;
  while (begin < s.size()) {
    char32_t cp;
    int n = decode_at(s, begin, &cp);
    if (!is_python_space(cp)) break;
    begin += n;
  }
  size_t end = s.size();
  while (end > begin) {
    size_t start = end - 1;  // walk back to the lead byte
    while (start > begin && ((unsigned char)s[start] & 0xC0) == 0x80) --start;
    char32_t cp;
    decode_at(s, start, &cp);
    if (!is_python_space(cp)) break;
    end = start;
  }
  return s.substr(begin, end - begin);
}

std::string_view rstrip_spaces(std::string_view s) {
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  return s;
}

void append(std::vector<int32_t>& to, const std::vector<int32_t>& from) { to.insert(to.end(), from.begin(), from.end()); }

// torchtune's last step of every tokenize_messages: with a limit, out marked truncated when longer
// than it, then tokens and mask cut to it; with an end token, the last token set to it and its mask
// to end_mask.
void truncate_messages(TokenizedMessages& out, int64_t max_seq_len, std::optional<int32_t> end, uint8_t end_mask) {
  if (max_seq_len <= 0) return;
  if ((int64_t)out.tokens.size() > max_seq_len) out.truncated = true;
  truncate_torchtune<int32_t>(out.tokens, max_seq_len, end);
  truncate_torchtune<uint8_t>(out.mask, max_seq_len, end ? std::optional<uint8_t>(end_mask) : std::nullopt);
}

}  // namespace

ChatFormatKind parse_chat_format(std::string_view name) {
  if (name == "llama3" || name == "llama3_1" || name == "llama3_2" || name == "llama3_3") return ChatFormatKind::kLlama3;
  if (name == "chatml" || name == "qwen2" || name == "qwen2_5" || name == "qwen3") return ChatFormatKind::kChatML;
  if (name == "mistral") return ChatFormatKind::kMistral;
  if (name == "gemma" || name == "gemma2") return ChatFormatKind::kGemma;
  if (name == "plain" || name == "llama2") return ChatFormatKind::kPlain;
  throw Error("chat_format", "unknown chat format '" + std::string(name) +
                                 "'; expected one of llama3, chatml (qwen2, qwen2_5, qwen3), mistral, gemma, plain");
}

std::string chat_format_name(ChatFormatKind kind) {
  switch (kind) {
    case ChatFormatKind::kLlama3: return "llama3";
    case ChatFormatKind::kChatML: return "chatml";
    case ChatFormatKind::kMistral: return "mistral";
    case ChatFormatKind::kGemma: return "gemma";
    case ChatFormatKind::kPlain: return "plain";
    case ChatFormatKind::kTemplate: return "chat_template";
  }
  return "plain";
}

std::optional<ChatFormatKind> chat_format_for_tokenizer_component(std::string_view component) {
  std::string_view name = component.substr(component.rfind('.') == std::string_view::npos ? 0 : component.rfind('.') + 1);
  auto starts = [&](std::string_view p) { return name.substr(0, p.size()) == p; };
  if (name.find("tokenizer") == std::string_view::npos) return std::nullopt;
  if (starts("llama3")) return ChatFormatKind::kLlama3;
  if (starts("qwen")) return ChatFormatKind::kChatML;
  if (starts("mistral")) return ChatFormatKind::kMistral;
  if (starts("gemma") || starts("llama2") || starts("code_llama2")) return ChatFormatKind::kPlain;
  return std::nullopt;
}

ChatFormatKind detect_chat_format(const Tokenizer& tokenizer) {
  if (tokenizer.token_to_id("<|start_header_id|>")) return ChatFormatKind::kLlama3;
  if (tokenizer.token_to_id("<|im_start|>")) return ChatFormatKind::kChatML;
  if (tokenizer.token_to_id("<start_of_turn>")) return ChatFormatKind::kGemma;
  if (tokenizer.token_to_id("[INST]")) return ChatFormatKind::kMistral;
  return ChatFormatKind::kPlain;
}

ChatFormat::ChatFormat(const Tokenizer& tokenizer, ChatFormatKind kind, int64_t max_seq_len,
                       std::optional<PromptTemplate> prompt_template)
    : tokenizer_(tokenizer), kind_(kind), max_seq_len_(max_seq_len), prompt_template_(std::move(prompt_template)) {
  if (kind_ == ChatFormatKind::kMistral && !prompt_template_) prompt_template_ = mistral_chat_template();
  // SentencePieceBaseTokenizer: encodes_whitespace = any(encode(c) for c in WHITESPACE_CHARS).
  encodes_whitespace_ = false;
  for (const char* c : {" ", "\n", "\t", "\r", "\v"})
    if (!encode(c).empty()) encodes_whitespace_ = true;
  newline_ids_ = encode("\n");
  // Fail now, not at the first sample, when the tokenizer lacks the format's special tokens.
  if (kind_ == ChatFormatKind::kLlama3)
    for (const char* t : {"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"})
      special(t);
  if (kind_ == ChatFormatKind::kChatML) { special("<|im_start|>"); special("<|im_end|>"); }
  if (kind_ == ChatFormatKind::kGemma) { special("<start_of_turn>"); special("<end_of_turn>"); }
}

ChatFormat::ChatFormat(const Tokenizer& tokenizer, HfChatTemplate chat_template, std::optional<int32_t> eos,
                       int64_t max_seq_len, Truncation truncation)
    : tokenizer_(tokenizer),
      kind_(ChatFormatKind::kTemplate),
      max_seq_len_(max_seq_len),
      chat_template_(std::move(chat_template)),
      template_eos_(eos),
      truncation_(truncation) {}

int32_t ChatFormat::special(const char* token) const {
  auto id = tokenizer_.token_to_id(token);
  if (!id)
    throw Error("tokenizer", "the " + chat_format_name(kind_) + " chat format needs the special token " + token +
                                 ", which this tokenizer does not have");
  return *id;
}

std::vector<int32_t> ChatFormat::encode(std::string_view text) const {
  if (kind_ == ChatFormatKind::kChatML || kind_ == ChatFormatKind::kTemplate) return tokenizer_.encode(text, false, false);
  return tokenizer_.encode_ordinary(text);
}

std::vector<int32_t> ChatFormat::encode_text(std::string_view text, bool add_bos, bool add_eos) const {
  if (kind_ == ChatFormatKind::kChatML || kind_ == ChatFormatKind::kTemplate) return tokenizer_.encode(text, add_bos, add_eos);
  std::vector<int32_t> ids;
  // torchtune's TikTokenBaseTokenizer.encode returns [] for empty text, BOS/EOS included.
  if (kind_ == ChatFormatKind::kLlama3 && text.empty()) return ids;
  if (add_bos && tokenizer_.bos_id()) ids.push_back(*tokenizer_.bos_id());
  append(ids, tokenizer_.encode_ordinary(text));
  if (add_eos && tokenizer_.eos_id()) ids.push_back(*tokenizer_.eos_id());
  return ids;
}

std::vector<int32_t> ChatFormat::encode_trimmed(std::string_view text) const {
  if (!encodes_whitespace_) return encode(text);
  std::string prefixed = "\n";
  prefixed += text;
  std::vector<int32_t> ids = encode(prefixed);
  // torchtune slices blindly; the check keeps byte-level tokenizers (where "\n" may merge with
  // the text) from losing a real token.
  if (ids.size() >= newline_ids_.size() && std::equal(newline_ids_.begin(), newline_ids_.end(), ids.begin()))
    return std::vector<int32_t>(ids.begin() + (ptrdiff_t)newline_ids_.size(), ids.end());
  return encode(text);
}

TokenizedMessages ChatFormat::tokenize(const std::vector<Message>& messages, bool add_end_tokens,
                                       const nlohmann::ordered_json& tools) const {
  if (kind_ != ChatFormatKind::kTemplate) {
    const bool offers_tools = !tools.is_null() && !(tools.is_array() && tools.empty());
    for (size_t i = 0; i < messages.size() && !offers_tools; ++i)
      if (messages[i].has_tool_calls())
        throw Error("message " + std::to_string(i),
                    "tool_calls need the model's own chat template: the " + chat_format_name(kind_) +
                        " format has no place for them (use the HuggingFaceModelTokenizer tokenizer component)");
    if (offers_tools)
      throw Error("tools", "a conversation's tools need the model's own chat template: the " + chat_format_name(kind_) +
                               " format has no place for them (use the HuggingFaceModelTokenizer tokenizer component)");
  }
  switch (kind_) {
    case ChatFormatKind::kLlama3: return tokenize_llama3(messages, add_end_tokens);
    case ChatFormatKind::kChatML: return tokenize_chatml(messages, add_end_tokens);
    case ChatFormatKind::kGemma: return tokenize_gemma(messages, add_end_tokens);
    case ChatFormatKind::kMistral:
    case ChatFormatKind::kPlain: return tokenize_no_special_tokens(messages, add_end_tokens);
    case ChatFormatKind::kTemplate: return tokenize_template(messages, add_end_tokens, tools);
  }
  return {};
}

// torchtune.models.llama3.Llama3Tokenizer.tokenize_messages
TokenizedMessages ChatFormat::tokenize_llama3(const std::vector<Message>& in, bool add_end_tokens) const {
  std::vector<Message> messages = prompt_template_ ? prompt_template_->apply(in) : in;
  const int32_t bos = special("<|begin_of_text|>"), eos = special("<|end_of_text|>");
  const int32_t start_header = special("<|start_header_id|>"), end_header = special("<|end_header_id|>");
  const int32_t eot = special("<|eot_id|>");
  TokenizedMessages out;
  out.tokens.push_back(bos);
  out.mask.push_back(1);
  for (size_t i = 0; i < messages.size(); ++i) {
    const Message& m = messages[i];
    const bool add_end = i + 1 == messages.size() ? add_end_tokens : true;
    std::vector<int32_t> ids;
    ids.push_back(start_header);                         // _tokenize_header
    append(ids, encode(python_strip(m.role)));
    ids.push_back(end_header);
    append(ids, encode("\n\n"));
    if (m.ipython) ids.push_back(special("<|python_tag|>"));  // _tokenize_body
    for (const std::string& piece : m.content) append(ids, encode(python_strip(piece)));
    if (add_end) ids.push_back(m.eot ? eot : special("<|eom_id|>"));  // _tokenize_end
    append(out.tokens, ids);
    out.mask.insert(out.mask.end(), ids.size(), m.masked ? 1 : 0);
    if (max_seq_len_ > 0 && (int64_t)out.tokens.size() >= max_seq_len_) {
      if (i + 1 < messages.size()) out.truncated = true;
      break;
    }
  }
  if (add_end_tokens) {
    out.tokens.push_back(eos);
    out.mask.push_back(1);
  }
  truncate_messages(out, max_seq_len_, add_end_tokens ? std::optional<int32_t>(eos) : std::nullopt, 1);
  return out;
}

// torchtune.models.qwen2_5.Qwen2_5Tokenizer.tokenize_messages (with its _tokenize_header/_footer)
TokenizedMessages ChatFormat::tokenize_chatml(const std::vector<Message>& in, bool add_end_tokens) const {
  std::vector<Message> messages = prompt_template_ ? prompt_template_->apply(in) : in;
  const int32_t im_start = special("<|im_start|>"), im_end = special("<|im_end|>");
  const int32_t eos = im_end;  // Qwen2_5Tokenizer's eos_token default is <|im_end|>
  auto start = [&](std::vector<int32_t>& ids, const std::string& role) {
    ids.push_back(im_start);
    append(ids, encode(role + "\n"));
  };
  auto end = [&](std::vector<int32_t>& ids) {
    ids.push_back(im_end);
    append(ids, encode("\n"));
  };
  TokenizedMessages out;
  const size_t n = messages.size();
  for (size_t i = 0; i < n; ++i) {
    const Message& m = messages[i];
    std::vector<int32_t> ids;
    if (m.role == "ipython") {
      if (i == 0 || messages[i - 1].role != "ipython") {
        start(ids, "user");
        append(ids, encode("<tool_response>\n"));
      } else {
        append(ids, encode("\n<tool_response>\n"));
      }
    } else {
      start(ids, m.role);
      if (m.role == "assistant" && m.ipython) {
        ids.push_back(special("<tool_call>"));
        append(ids, encode("\n"));
      }
    }
    for (const std::string& piece : m.content) append(ids, encode(piece));
    if (m.role == "ipython") {
      append(ids, encode("\n</tool_response>"));
      if (i + 1 == n || messages[i + 1].role != "ipython") end(ids);
    } else {
      if (m.role == "assistant" && m.ipython) {
        append(ids, encode("\n"));
        ids.push_back(special("</tool_call>"));
      }
      if (m.role != "assistant" || i + 1 != n) end(ids);
    }
    append(out.tokens, ids);
    out.mask.insert(out.mask.end(), ids.size(), m.masked ? 1 : 0);
    if (max_seq_len_ > 0 && (int64_t)out.tokens.size() >= max_seq_len_) {
      if (i + 1 < n) out.truncated = true;
      break;
    }
  }
  if (add_end_tokens) {
    out.tokens.push_back(eos);
    out.mask.push_back(out.mask.empty() ? 1 : out.mask.back());
  }
  truncate_messages(out, max_seq_len_, add_end_tokens ? std::optional<int32_t>(eos) : std::nullopt, 1);
  return out;
}

// Gemma's HF chat template ("<bos><start_of_turn>user\n{system}\n\n{user}<end_of_turn>\n
// <start_of_turn>model\n{answer}<end_of_turn>\n") with torchtune's masking and truncation rules.
TokenizedMessages ChatFormat::tokenize_gemma(const std::vector<Message>& in, bool add_end_tokens) const {
  std::vector<Message> messages = prompt_template_ ? prompt_template_->apply(in) : in;
  if (messages.size() >= 2 && messages[0].role == "system" && messages[1].role == "user") {
    Message merged = messages[1];
    std::vector<std::string> content = messages[0].content;
    content.push_back("\n\n");
    content.insert(content.end(), merged.content.begin(), merged.content.end());
    merged.content = std::move(content);
    messages.erase(messages.begin());
    messages[0] = std::move(merged);
  }
  const int32_t start_turn = special("<start_of_turn>"), end_turn = special("<end_of_turn>");
  auto bos = tokenizer_.bos_id(), eos = tokenizer_.eos_id();
  if (!bos || !eos) throw Error("tokenizer", "the gemma chat format needs the tokenizer's BOS and EOS tokens");
  TokenizedMessages out;
  out.tokens.push_back(*bos);
  out.mask.push_back(1);
  for (size_t i = 0; i < messages.size(); ++i) {
    const Message& m = messages[i];
    if (m.role == "system" || m.role == "ipython")
      throw Error("gemma chat format", "role '" + m.role + "' at message " + std::to_string(i) +
                                           " has no Gemma turn (a system prompt is only allowed before the first user message)");
    std::vector<int32_t> ids;
    ids.push_back(start_turn);
    append(ids, encode(m.role == "assistant" ? "model\n" : m.role + "\n"));
    for (const std::string& piece : m.content) append(ids, encode(piece));
    ids.push_back(end_turn);
    append(ids, encode("\n"));
    append(out.tokens, ids);
    out.mask.insert(out.mask.end(), ids.size(), m.masked ? 1 : 0);
    if (max_seq_len_ > 0 && (int64_t)out.tokens.size() >= max_seq_len_) {
      if (i + 1 < messages.size()) out.truncated = true;
      break;
    }
  }
  if (add_end_tokens) {
    out.tokens.push_back(*eos);
    out.mask.push_back(out.mask.back());
  }
  truncate_messages(out, max_seq_len_, add_end_tokens ? std::optional<int32_t>(*eos) : std::nullopt, 1);
  return out;
}

// torchtune.modules.transforms.tokenizers.tokenize_messages_no_special_tokens
TokenizedMessages ChatFormat::tokenize_no_special_tokens(const std::vector<Message>& in, bool add_end_tokens) const {
  std::vector<Message> messages = prompt_template_ ? prompt_template_->apply(in) : in;
  const std::optional<int32_t> bos = tokenizer_.bos_id();
  const std::optional<int32_t> eos = add_end_tokens ? tokenizer_.eos_id() : std::nullopt;
  bool start_of_turn = true, prev_ends_with_space = false;
  bool last_masked = false;
  TokenizedMessages out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const Message& m = messages[i];
    last_masked = m.masked;
    const bool end_of_turn = m.role == "assistant";
    if (start_of_turn && bos) {
      out.tokens.push_back(*bos);
      out.mask.push_back(m.masked ? 1 : 0);
    }
    const bool trim = !start_of_turn && !prev_ends_with_space;
    size_t before = out.tokens.size();
    for (const std::string& piece : m.content) {
      std::string_view text = rstrip_spaces(piece);
      append(out.tokens, trim ? encode_trimmed(text) : encode(text));
    }
    if (!m.content.empty()) prev_ends_with_space = !m.content.back().empty() && m.content.back().back() == ' ';
    out.mask.insert(out.mask.end(), out.tokens.size() - before, m.masked ? 1 : 0);
    if (end_of_turn) {
      if (eos) {
        out.tokens.push_back(*eos);
        out.mask.push_back(m.masked ? 1 : 0);
      }
      start_of_turn = true;
    } else {
      start_of_turn = false;
    }
    if (max_seq_len_ > 0 && (int64_t)out.tokens.size() >= max_seq_len_) {
      if (i + 1 < messages.size()) out.truncated = true;
      break;
    }
  }
  truncate_messages(out, max_seq_len_, eos, last_masked ? 1 : 0);
  return out;
}

// The model's chat template. The ids are the encoding of the whole conversation's text (so they
// are transformers' apply_chat_template(tokenize=True) ids: a message's ids are not encoded apart
// from its neighbours'). Message i's ids end where the ids of the conversation rendered up to and
// including message i end (torchtune's HuggingFaceModelTokenizer takes the same deltas). A template
// that renders earlier messages differently once later ones follow (Qwen3 drops the reasoning of
// answers before the last question) has no such prefix: the boundary is then where the two texts
// part. Deliberately not torchtune's: a conversation is trained without the generation prompt after
// it (torchtune renders add_generation_prompt=add_eos for the last message, training the next
// answer's header), and the EOS is not appended twice (Llama 3 Instruct's eos_token is the
// template's own <|eot_id|>).
TokenizedMessages ChatFormat::tokenize_template(const std::vector<Message>& in, bool add_end_tokens,
                                                const nlohmann::ordered_json& tools) const {
  std::vector<Message> messages = in;
  // Asking: an empty assistant message last (the answer to come) is the generation prompt.
  if (!add_end_tokens && !messages.empty() && messages.back().role == "assistant" &&
      messages.back().text_content().empty() && !messages.back().has_tool_calls())
    messages.pop_back();
  const std::string text = chat_template_->render(messages, /*add_generation_prompt=*/!add_end_tokens, tools);
  TokenizedMessages out;
  out.tokens = tokenizer_.encode(text, false, false);
  size_t begin = 0;
  for (size_t i = 0; i < messages.size(); ++i) {
    size_t end = out.tokens.size();
    if (i + 1 < messages.size()) {
      const std::vector<Message> upto(messages.begin(), messages.begin() + (ptrdiff_t)i + 1);
      const std::string prefix = chat_template_->render(upto, false, tools);
      size_t common = 0;
      while (common < prefix.size() && common < text.size() && prefix[common] == text[common]) ++common;
      while (common > 0 && common < text.size() && ((unsigned char)text[common] & 0xC0) == 0x80) --common;
      end = std::clamp(tokenizer_.encode(std::string_view(text).substr(0, common), false, false).size(), begin,
                       out.tokens.size());
    }
    out.mask.insert(out.mask.end(), end - begin, messages[i].masked ? 1 : 0);
    begin = end;
  }
  if (messages.empty()) out.mask.assign(out.tokens.size(), 1);  // a template's text around no message
  if (add_end_tokens && template_eos_ && (out.tokens.empty() || out.tokens.back() != *template_eos_)) {
    out.tokens.push_back(*template_eos_);
    out.mask.push_back(1);
  }
  if (truncation_ == Truncation::kLeft && max_seq_len_ > 0 && (int64_t)out.tokens.size() > max_seq_len_) {
    const ptrdiff_t cut = (ptrdiff_t)out.tokens.size() - (ptrdiff_t)max_seq_len_;
    out.tokens.erase(out.tokens.begin(), out.tokens.begin() + cut);
    out.mask.erase(out.mask.begin(), out.mask.begin() + cut);
    out.truncated = true;
  }
  truncate_messages(out, max_seq_len_, add_end_tokens ? template_eos_ : std::nullopt, 1);
  return out;
}

}  // namespace ktune
