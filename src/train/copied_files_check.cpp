#include "train/copied_files_check.h"

#include <algorithm>
#include <fstream>
#include <iterator>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace ktune::train {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const char* const kCopiedNote = " (a save copies it into every checkpoint, where transformers could not read it)";

json parse_json_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path.string(), "cannot read");
  const std::string text(std::istreambuf_iterator<char>(in), {});
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw Error(path.string(), std::string("not valid JSON: ") + e.what() + kCopiedNote);
  }
}

// Every token string a tokenizer.json knows: its model's vocabulary (an object of token -> id for
// BPE, WordPiece and WordLevel; a list of [token, score] for Unigram) and its added tokens.
std::set<std::string> tokenizer_json_tokens(const json& tokenizer) {
  std::set<std::string> tokens;
  if (tokenizer.contains("model") && tokenizer["model"].is_object() && tokenizer["model"].contains("vocab")) {
    const json& vocab = tokenizer["model"]["vocab"];
    if (vocab.is_object())
      for (const auto& [token, id] : vocab.items()) tokens.insert(token);
    else if (vocab.is_array())
      for (const json& entry : vocab)
        if (entry.is_array() && !entry.empty() && entry[0].is_string()) tokens.insert(entry[0].get<std::string>());
  }
  if (tokenizer.contains("added_tokens") && tokenizer["added_tokens"].is_array())
    for (const json& t : tokenizer["added_tokens"])
      if (t.is_object() && t.contains("content") && t["content"].is_string()) tokens.insert(t["content"].get<std::string>());
  return tokens;
}

void check_special_tokens(const json& config, const std::string& where, const std::set<std::string>* vocabulary) {
  for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"}) {
    if (!config.contains(key) || config[key].is_null()) continue;
    const json& v = config[key];
    std::string token;
    if (v.is_string()) token = v.get<std::string>();
    else if (v.is_object() && v.contains("content") && v["content"].is_string()) token = v["content"].get<std::string>();
    else throw Error(where + ": " + key, "expected a token (a string or {\"content\": string}), got " + v.dump() + kCopiedNote);
    if (vocabulary && !vocabulary->count(token))
      throw Error(where + ": " + key, "token '" + token + "' is in neither the vocabulary nor the added tokens of the " +
                                          "tokenizer.json beside it" + kCopiedNote);
  }
}

void check_chat_template(const json& config, const std::string& where) {
  if (!config.contains("chat_template") || config["chat_template"].is_null()) return;
  const json& t = config["chat_template"];
  if (t.is_string()) return;
  const bool named_templates = t.is_array() && std::all_of(t.begin(), t.end(), [](const json& entry) {
    return entry.is_object() && entry.contains("name") && entry["name"].is_string() && entry.contains("template") &&
           entry["template"].is_string();
  });
  if (!named_templates)
    throw Error(where + ": chat_template",
                "expected a Jinja template (a string) or a list of {\"name\", \"template\"} strings, got " +
                    std::string(t.type_name()) + kCopiedNote);
}

}  // namespace

void check_copied_files(const fs::path& dir, const std::vector<fs::path>& files) {
  for (const fs::path& rel : files) {
    if (rel.extension() != ".json") continue;
    const fs::path path = dir / rel;
    const json j = parse_json_file(path);
    if (rel.filename() != "tokenizer_config.json") continue;
    if (!j.is_object()) throw Error(path.string(), std::string("expected a JSON object, got ") + j.type_name() + kCopiedNote);
    const fs::path beside = path.parent_path() / "tokenizer.json";
    std::set<std::string> vocabulary;
    const bool has_tokenizer = fs::is_regular_file(beside);
    if (has_tokenizer) vocabulary = tokenizer_json_tokens(parse_json_file(beside));
    check_special_tokens(j, path.string(), has_tokenizer ? &vocabulary : nullptr);
    check_chat_template(j, path.string());
  }
}

}  // namespace ktune::train
