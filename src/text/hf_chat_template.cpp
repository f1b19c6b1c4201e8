// A model's chat template rendered as transformers renders it (see hf_chat_template.h).
#include "text/hf_chat_template.h"

#include <filesystem>

#include "core/error.h"
#include "text/jinja/chat_template.h"
#include "text/tokenizer_formats.h"

namespace ktune {

namespace fs = std::filesystem;
using nlohmann::json;
using nlohmann::ordered_json;

namespace {

// transformers' SPECIAL_TOKENS_ATTRIBUTES: the names special_tokens_map gives the template.
constexpr const char* kSpecialTokenNames[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                              "pad_token", "cls_token", "mask_token"};

// Each special token the config names, as its text ({"content": …} entries are AddedTokens).
ordered_json special_tokens_of(const json& config) {
  ordered_json tokens = ordered_json::object();
  for (const char* name : kSpecialTokenNames) {
    auto it = config.find(name);
    if (it == config.end()) continue;
    if (it->is_string()) tokens[name] = it->get<std::string>();
    else if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
      tokens[name] = (*it)["content"].get<std::string>();
  }
  return tokens;
}

// The config's chat_template: a string, or a list of {"name", "template"} of which "default" is
// taken (transformers' choice without tools). nullopt when absent or null.
std::optional<std::string> template_in_config(const json& config, const std::string& path) {
  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array())
    throw Error(path + ": chat_template", "must be a string or a list of {\"name\", \"template\"}, not " +
                                              std::string(it->type_name()));
  std::vector<std::string> names;
  for (const json& entry : *it) {
    if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() || !entry.contains("template") ||
        !entry["template"].is_string())
      throw Error(path + ": chat_template", "each entry of a list of templates must be {\"name\": str, \"template\": str}");
    if (entry["name"] == "default") return entry["template"].get<std::string>();
    names.push_back(entry["name"].get<std::string>());
  }
  std::string listed;
  for (const std::string& n : names) listed += (listed.empty() ? "" : ", ") + n;
  throw Error(path + ": chat_template", "holds several templates (" + listed + ") and none is named \"default\"");
}

}  // namespace

HfChatTemplate::HfChatTemplate(const std::string& source, std::string origin, ordered_json special_tokens)
    : template_(std::make_shared<const jinja::Template>(
          source, jinja::TemplateOptions{jinja::Dialect::kTransformers, /*strict_undefined=*/false}, origin)),
      origin_(std::move(origin)),
      special_tokens_(std::move(special_tokens)) {}

HfChatTemplate::~HfChatTemplate() = default;

std::optional<HfChatTemplate> HfChatTemplate::from_tokenizer_config(const std::string& tokenizer_config_path) {
  const json config = text::read_json_file(tokenizer_config_path);
  if (!config.is_object()) throw Error(tokenizer_config_path, "must be a JSON object");
  // transformers: "If independent chat template file(s) exist, they take priority".
  const fs::path jinja_file = fs::path(tokenizer_config_path).parent_path() / "chat_template.jinja";
  if (fs::is_regular_file(jinja_file))
    return HfChatTemplate(text::read_file_bytes(jinja_file.string()), jinja_file.string(), special_tokens_of(config));
  std::optional<std::string> source = template_in_config(config, tokenizer_config_path);
  if (!source) return std::nullopt;
  return HfChatTemplate(*source, tokenizer_config_path + ": chat_template", special_tokens_of(config));
}

std::string HfChatTemplate::render(const std::vector<Message>& messages, bool add_generation_prompt,
                                   const ordered_json& tools) const {
  ordered_json list = ordered_json::array();
  for (const Message& m : messages) {
    if (m.source.is_object()) {  // as the dataset gave it, every key in its order
      list.push_back(m.source);
      continue;
    }
    list.push_back(ordered_json{{"role", m.role == "ipython" ? std::string("tool") : m.role},
                                {"content", m.text_content()}});
  }
  // render_jinja_template's call: messages, tools, documents, add_generation_prompt, then the
  // special tokens (apply_chat_template's template_kwargs).
  ordered_json context = ordered_json::object();
  context["messages"] = std::move(list);
  context["tools"] = tools;
  context["documents"] = nullptr;
  context["add_generation_prompt"] = add_generation_prompt;
  for (const auto& [name, value] : special_tokens_.items()) context[name] = value;
  return template_->render(context);
}

std::optional<int32_t> HfChatTemplate::eos_id(const Tokenizer& tokenizer, const std::string& generation_config_path) const {
  // The tokenizer, loaded with the same tokenizer_config.json, resolved that name (load_tokenizer
  // refuses an unknown one).
  if (special_tokens_.contains("eos_token")) return tokenizer.eos_id();
  if (!generation_config_path.empty()) {
    const json config = text::read_json_file(generation_config_path);
    const json* eos = config.is_object() && config.contains("eos_token_id") ? &config["eos_token_id"] : nullptr;
    if (eos && eos->is_array() && !eos->empty()) eos = &(*eos)[0];
    if (eos && eos->is_number_integer()) {
      const int64_t id = eos->get<int64_t>();
      if (id < 0 || id >= tokenizer.vocab_size())
        throw Error(generation_config_path + ": eos_token_id",
                    std::to_string(id) + " is not an id of the tokenizer (" + std::to_string(tokenizer.vocab_size()) + " ids)");
      return int32_t(id);
    }
    if (eos && !eos->is_null())
      throw Error(generation_config_path + ": eos_token_id", "must be an integer or a list of integers");
  }
  return tokenizer.eos_id();
}

}  // namespace ktune
