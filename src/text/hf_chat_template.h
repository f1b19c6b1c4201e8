// A Hugging Face model's own chat template (the Jinja `chat_template` of tokenizer_config.json, or
// the chat_template.jinja beside it, which transformers prefers), rendered as transformers'
// apply_chat_template renders it: its Jinja environment (text/jinja/, Dialect::kTransformers:
// trim_blocks, lstrip_blocks, loop controls, its tojson) and its variables — `messages` (each
// {"role", "content"}, or the dataset's own message with its tool_calls), `tools` (the
// conversation's tool schemas, or none), `documents` (none), `add_generation_prompt`, and the special
// tokens as strings (bos_token, eos_token, unk_token, sep_token, pad_token, cls_token, mask_token,
// where the config names them). The text is what transformers, and vLLM's chat completions, prompt
// the model with; its ids are the tokenizer's encoding of that text with no special tokens added
// (apply_chat_template(tokenize=True)), so the template alone decides where BOS goes.
//
// Several named templates (a list of {"name", "template"}) give "default", as transformers does
// without tools. A template that does not parse is refused at load, naming the file, line and column.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/prompt_template.h"
#include "text/tokenizer.h"

namespace ktune {

namespace jinja {
class Template;
}

class HfChatTemplate {
 public:
  // Parses `source`; origin names it in errors ("…/tokenizer_config.json: chat_template").
  // special_tokens: an object of the special-token variables, each a string.
  HfChatTemplate(const std::string& source, std::string origin, nlohmann::ordered_json special_tokens);
  ~HfChatTemplate();

  // From the model's files: chat_template.jinja beside tokenizer_config.json when there is one, else
  // the config's chat_template; special tokens from the config. nullopt when neither holds a template.
  // Errors name the file (not JSON, a chat_template neither a string nor a list of named templates,
  // several templates with no "default", a template that does not parse).
  static std::optional<HfChatTemplate> from_tokenizer_config(const std::string& tokenizer_config_path);

  // The conversation as text. A message with a source (Message::source: an openai-style dataset's
  // message, tool_calls and all) is passed as it is; others as {role, content}, the content their
  // pieces joined and torchtune's "ipython" (a tool's answer) as HF's "tool". tools: the `tools`
  // variable (a list of tool schemas, or null), as apply_chat_template(tools=...) passes it.
  std::string render(const std::vector<Message>& messages, bool add_generation_prompt,
                     const nlohmann::ordered_json& tools = nullptr) const;

  const std::string& origin() const { return origin_; }

  // The id a conversation ends with (torchtune's HuggingFaceBaseTokenizer): the eos_token the
  // tokenizer_config.json names (as `tokenizer`, loaded with that config, resolved it), else the first
  // eos_token_id of generation_config.json (when given), else the tokenizer's own EOS. Errors name
  // the generation config.
  std::optional<int32_t> eos_id(const Tokenizer& tokenizer, const std::string& generation_config_path = "") const;

 private:
  std::shared_ptr<const jinja::Template> template_;
  std::string origin_;
  nlohmann::ordered_json special_tokens_;
};

}  // namespace ktune
