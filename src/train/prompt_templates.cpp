// torchtune's prompt templates by name, and custom ones from a dict. See prompt_templates.h.
#include "train/prompt_templates.h"

#include <map>
#include <set>
#include <vector>

#include "core/error.h"

namespace ktune::train {

namespace {

PromptTemplate user_tags(const std::string& prepend, const std::string& append) {
  PromptTemplate t;
  t.tags = {{"user", {prepend, append}}};
  return t;
}

// torchtune.data's partial(PromptTemplate, template={...}) templates, word for word, and Mistral's.
const std::map<std::string, PromptTemplate>& named_templates() {
  static const std::map<std::string, PromptTemplate> named = {
      {"torchtune.data.GrammarErrorCorrectionTemplate",
       user_tags("Correct this to standard English: ", "\n---\nCorrected: ")},
      {"torchtune.data.SummarizeTemplate", user_tags("Summarize this dialogue:\n", "\n---\nSummary:\n")},
      {"torchtune.data.QuestionAnswerTemplate", user_tags("Question: ", "\n\nAnswer: ")},
      {"torchtune.models.mistral.MistralChatTemplate", mistral_chat_template()},
  };
  return named;
}

std::string known_names() {
  std::string out;
  for (const auto& [name, t] : named_templates()) out += (out.empty() ? "" : ", ") + name;
  return out;
}

}  // namespace

std::optional<PromptTemplate> prompt_template_from_config(const ConfigNode& node, const std::string& key) {
  const std::string where = "config key " + key;
  if (node.is_null()) return std::nullopt;
  if (node.is_string()) {
    const std::string& name = node.as_string();
    auto it = named_templates().find(name);
    if (it != named_templates().end()) return it->second;
    if (name == "torchtune.data.ChatMLTemplate" || name == "torchtune.models.llama2.Llama2ChatTemplate")
      throw Error(where, "`" + name + "` formats whole conversations its own way, which ktune does not do; "
                         "supported: " + known_names() + ", or a dict of role: [prepend, append]");
    throw Error(where, "unknown prompt template `" + name + "`; expected one of " + known_names() +
                           ", or a dict of role: [prepend, append]");
  }
  if (!node.is_map())
    throw Error(where, "must be a template's dotted name or a dict of role: [prepend, append] (torchtune's "
                       "PromptTemplate)");
  static const std::set<std::string> kRoles = {"system", "user", "assistant", "ipython"};
  PromptTemplate t;
  for (const auto& [role, tags] : node.entries()) {
    const std::string at = where + "." + role;
    if (!kRoles.count(role)) throw Error(at, "not a role: expected system, user, assistant or ipython");
    if (!tags.is_list() || tags.items().size() != 2 || !tags.items()[0].is_string() || !tags.items()[1].is_string())
      throw Error(at, "must be a list of two strings: [prepend tag, append tag]");
    t.tags[role] = {tags.items()[0].as_string(), tags.items()[1].as_string()};
  }
  return t;
}

}  // namespace ktune::train
