// Messages, templates and the instruct/alpaca transforms (see prompt_template.h). The texts and
// rules follow torchtune 0.6.1 (torchtune/data/_messages.py, _prompt_templates.py,
// models/mistral/_prompt_template.py); tests/data compares the resulting tokens with torchtune's.
#include "text/prompt_template.h"

#include "core/error.h"

namespace ktune {

Message Message::text(std::string role, std::string content, bool masked) {
  Message m;
  m.role = std::move(role);
  m.content.push_back(std::move(content));
  m.masked = masked;
  return m;
}

std::string Message::text_content() const {
  std::string out;
  for (const std::string& piece : content) out += piece;
  return out;
}

bool Message::has_tool_calls() const {
  if (!source.is_object()) return false;
  auto it = source.find("tool_calls");
  return it != source.end() && !it->is_null() && !(it->is_array() && it->empty());
}

std::vector<Message> PromptTemplate::apply(const std::vector<Message>& messages) const {
  std::vector<Message> out;
  out.reserve(messages.size());
  for (const Message& m : messages) {
    if (reject_system && m.role == "system")
      throw Error("prompt template", "system prompts are not supported by this chat format (torchtune's MistralChatTemplate)");
    Message t = m;
    auto it = tags.find(m.role);
    if (it != tags.end()) {
      const auto& [prepend, append] = it->second;
      if (keep_empty_tags || !prepend.empty()) t.content.insert(t.content.begin(), prepend);
      if (keep_empty_tags || !append.empty()) t.content.push_back(append);
    }
    out.push_back(std::move(t));
  }
  return out;
}

PromptTemplate mistral_chat_template() {
  PromptTemplate t;
  t.tags = {{"user", {"[INST] ", " [/INST] "}}, {"assistant", {"", ""}}, {"ipython", {"", ""}}};
  t.keep_empty_tags = true;
  t.reject_system = true;
  return t;
}

std::vector<Message> input_output_to_messages(const std::string& input, const std::string& output,
                                              bool train_on_input,
                                              const std::optional<std::string>& new_system_prompt) {
  std::vector<Message> messages;
  if (new_system_prompt) messages.push_back(Message::text("system", *new_system_prompt, true));
  messages.push_back(Message::text("user", input, !train_on_input));
  messages.push_back(Message::text("assistant", output, false));
  return messages;
}

std::string alpaca_prompt(const std::string& instruction, const std::string& input) {
  // torchtune's AlpacaToMessages.template, word for word.
  if (!input.empty())
    return "Below is an instruction that describes a task, paired with an input that provides further "
           "context. Write a response that appropriately completes the request.\n\n### Instruction:\n" +
           instruction + "\n\n### Input:\n" + input + "\n\n### Response:\n";
  return "Below is an instruction that describes a task. Write a response that appropriately completes "
         "the request.\n\n### Instruction:\n" +
         instruction + "\n\n### Response:\n";
}

std::vector<Message> alpaca_to_messages(const std::string& instruction, const std::string& input,
                                        const std::string& output, bool train_on_input) {
  return {Message::text("user", alpaca_prompt(instruction, input), !train_on_input),
          Message::text("assistant", output, false)};
}

void validate_messages(const std::vector<Message>& messages, const std::string& where) {
  if (messages.size() < 2)
    throw Error(where, "a conversation needs at least 2 messages, got " + std::to_string(messages.size()));
  std::string last_turn = "assistant";
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    // An answer follows a question, or a tool's result (ktune: torchtune's rule refuses an
    // assistant after an ipython message, which every tool-calling conversation has).
    if (role == "assistant" && last_turn != "user" && last_turn != "ipython")
      throw Error(where, "assistant message before the expected user message at index " + std::to_string(i));
    if (role == "user" && last_turn == "user")
      throw Error(where, "two consecutive user messages at index " + std::to_string(i) + " and " + std::to_string(i - 1));
    if (role == "system" && i > 0)
      throw Error(where, "system message at index " + std::to_string(i) + ", but system messages must come first");
    last_turn = role;
  }
}

}  // namespace ktune
