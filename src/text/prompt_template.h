// Messages and the transforms that turn a dataset row's strings into them, with torchtune 0.6.1's
// names and wording: Message (role, content pieces, masked, ipython, eot), PromptTemplate (tags
// around each role's content, torchtune's custom `prompt_template` dict), the instruct transform
// (InputOutputToMessages: user input → assistant output, optional new system prompt), the alpaca
// transform (AlpacaToMessages' two prompt texts, word for word) and validate_messages.
//
// "masked" means "do not train on these tokens" (torchtune's convention); labels become -100
// there. The content of a message is a list of text pieces, because torchtune's templates add
// their tags as separate pieces and SentencePiece formats encode each piece on its own.
//
// Deliberately not here: reading rows or columns (data/), chat styles keyed on JSON field names
// (data/message_transforms), token ids (text/chat_format), images.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace ktune {

struct Message {
  std::string role;                  // "system" | "user" | "assistant" | "ipython"
  std::vector<std::string> content;  // text pieces, encoded one after another
  bool masked = false;               // true: not trained on (label -100)
  bool ipython = false;              // an assistant tool call
  bool eot = true;                   // end of turn (Llama 3: <|eot_id|>, else <|eom_id|>)
  // The message as an openai-style dataset gave it (every key: role, content, tool_calls, name,
  // tool_call_id, ...), handed to a model's own chat template as it is, as transformers'
  // apply_chat_template hands it over; null for messages made otherwise (role and content then).
  nlohmann::ordered_json source;

  static Message text(std::string role, std::string content, bool masked = false);
  std::string text_content() const;  // the pieces joined
  bool has_tool_calls() const;       // source carries a non-empty tool_calls list
};

// torchtune's PromptTemplate: role → (prepend tag, append tag). Empty tags are left out unless
// keep_empty_tags (MistralChatTemplate adds them even when empty, which matters to
// tokenize_messages_no_special_tokens' "previous piece ends with a space" rule).
struct PromptTemplate {
  std::map<std::string, std::pair<std::string, std::string>> tags;
  bool keep_empty_tags = false;
  bool reject_system = false;  // MistralChatTemplate raises on system messages

  std::vector<Message> apply(const std::vector<Message>& messages) const;
};

// torchtune.models.mistral.MistralChatTemplate: user → "[INST] " … " [/INST] ", no system role.
PromptTemplate mistral_chat_template();

// torchtune.data.InputOutputToMessages: [system (new_system_prompt, masked)], user (input,
// masked = !train_on_input), assistant (output, trained).
std::vector<Message> input_output_to_messages(const std::string& input, const std::string& output,
                                              bool train_on_input,
                                              const std::optional<std::string>& new_system_prompt);

// torchtune.data.AlpacaToMessages: the alpaca prompt (with or without the "### Input:" block,
// chosen by whether input is empty) as the user message, output as the assistant message.
std::vector<Message> alpaca_to_messages(const std::string& instruction, const std::string& input,
                                        const std::string& output, bool train_on_input);
// The alpaca prompt text alone (what a user types at inference time).
std::string alpaca_prompt(const std::string& instruction, const std::string& input);

// torchtune.data.validate_messages: at least two messages, system only first, no assistant
// before a user (or, unlike torchtune, a tool's result: role ipython), no two users in a row.
// Throws ktune::Error(where, what).
void validate_messages(const std::vector<Message>& messages, const std::string& where);

}  // namespace ktune
