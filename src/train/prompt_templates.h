// tokenizer.prompt_template as torchtune 0.6.1 reads it (data/_prompt_templates.py's
// _get_prompt_template): the dotted name of one of torchtune's templates, or a dict of role ->
// [prepend tag, append tag] (a custom PromptTemplate). The tags go around each message of that role
// (text/prompt_template.h); the tokenizer then formats the messages as it always does.
// It deliberately knows only torchtune's tag templates: ChatMLTemplate and Llama2ChatTemplate format
// whole conversations their own way and are refused, naming the ones that work.
#pragma once

#include <optional>
#include <string>

#include "text/prompt_template.h"
#include "train/config.h"

namespace ktune::train {

// null (or absent): std::nullopt, the tokenizer's default. Throws Error("config key <key>", why).
std::optional<PromptTemplate> prompt_template_from_config(const ConfigNode& node,
                                                          const std::string& key = "tokenizer.prompt_template");

}  // namespace ktune::train
