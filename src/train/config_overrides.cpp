// Applying torchtune's `key=value` / `~key` overrides to a config tree. See config_overrides.h.
#include "train/config_overrides.h"

#include <yaml-cpp/yaml.h>

#include "core/error.h"
#include "train/config_suggest.h"

namespace ktune::train {

static std::string trim(const std::string& s) {
  std::size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  std::size_t e = s.find_last_not_of(" \t");
  return s.substr(b, e - b + 1);
}

static bool valid_key(const std::string& key) {
  if (key.empty() || key.front() == '.' || key.back() == '.' || key.find("..") != std::string::npos) return false;
  for (char c : key)
    if (c == ' ' || c == '\t' || c == '=' || c == '~' || c == '[' || c == ']' || c == '{' || c == '}') return false;
  return true;
}

static std::vector<std::string> split_path(const std::string& key) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (true) {
    std::size_t dot = key.find('.', start);
    parts.push_back(key.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return parts;
}

ConfigNode parse_override_value(const std::string& raw, const std::string& key) {
  std::string v = trim(raw);
  // torchtune's parser tags these `!!str` (TuneRecipeArgumentParser: "max_filename" in the key), so
  // `checkpoint_files.max_filename=00030` stays the string "00030", never the octal 24.
  const bool quoted = v.size() >= 2 && ((v.front() == '\'' && v.back() == '\'') || (v.front() == '"' && v.back() == '"'));
  if (key.find("max_filename") != std::string::npos && !quoted) return ConfigNode::string(v);
  if (v == "None") return ConfigNode::null();
  bool flow = !v.empty() && (v.front() == '[' || v.front() == '{');
  if (!flow && !quoted) return type_plain_scalar(v);
  ConfigNode parsed;
  try {
    parsed = load_config_yaml("value: " + v + "\n", "override " + key);
  } catch (const Error& e) {
    throw Error("override `" + key + "=" + raw + "`", "cannot parse value `" + raw + "` as YAML (" + e.what_only() + ")");
  }
  const ConfigNode* value = parsed.find("value");
  if (value == nullptr || parsed.entries().size() != 1)
    throw Error("override `" + key + "=" + raw + "`", "cannot parse value `" + raw + "` as one YAML value");
  if (quoted && !value->is_string())
    throw Error("override `" + key + "=" + raw + "`", "cannot parse quoted value `" + raw + "`");
  return *value;
}

// The node and everything in it came from one place (an override's flow value: {a: 1, b: [2]}).
static void set_origin_throughout(ConfigNode& node, const std::string& origin) {
  node.set_origin(origin);
  if (node.is_list())
    for (ConfigNode& item : node.items()) set_origin_throughout(item, origin);
  if (node.is_map())
    for (auto& [key, value] : node.entries()) set_origin_throughout(value, origin);
}

ConfigOverride parse_override(const std::string& arg) {
  ConfigOverride o;
  o.text = arg;
  if (!arg.empty() && arg[0] == '~') {
    o.op = ConfigOverride::Op::Delete;
    o.key = arg.substr(1, arg.find('=') == std::string::npos ? std::string::npos : arg.find('=') - 1);
    if (!valid_key(o.key)) throw Error("override `" + arg + "`", "expected ~KEY with a dotted KEY");
    if (o.key.find("_component_") != std::string::npos)
      throw Error("override `" + arg + "`", "removing components from the command line is not supported");
    return o;
  }
  std::size_t eq = arg.find('=');
  if (eq == std::string::npos)
    throw Error("override `" + arg + "`", "command-line overrides must be in the form key=value");
  o.key = trim(arg.substr(0, eq));
  if (!valid_key(o.key)) throw Error("override `" + arg + "`", "`" + o.key + "` is not a dotted key like a.b.c");
  o.value = parse_override_value(arg.substr(eq + 1), o.key);
  set_origin_throughout(o.value, "override `" + arg + "`");
  return o;
}

// OmegaConf.merge: a map merged onto a map recurses key by key; anything else replaces.
static void merge_into(ConfigNode& target, const ConfigNode& value) {
  if (target.is_map() && value.is_map()) {
    for (const auto& [k, v] : value.entries()) {
      if (ConfigNode* existing = target.find(k))
        merge_into(*existing, v);
      else
        target.set(k, v);
    }
    return;
  }
  target = value;
}

static std::string parent_of(const std::string& path) {
  std::size_t dot = path.rfind('.');
  return dot == std::string::npos ? path : path.substr(0, dot);
}

static std::string with_article(const std::string& kind) {
  return (kind == "int" ? "an " : "a ") + kind;
}

static void apply_set(ConfigNode& tree, const ConfigOverride& o) {
  std::vector<std::string> parts = split_path(o.key);
  ConfigNode* node = &tree;
  std::string walked;
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
    const std::string& part = parts[i];
    walked += (walked.empty() ? "" : ".") + part;
    if (node->is_map()) {
      ConfigNode* child = node->find(part);
      if (child == nullptr || child->is_null()) child = &node->set(part, ConfigNode::map());
      node = child;
    } else if (node->is_list()) {
      ConfigNode* child = node->find_path(part);
      if (child == nullptr) throw Error("override `" + o.text + "`", "`" + walked + "` is not an index of the list");
      node = child;
    } else {
      throw Error("override `" + o.text + "`", "cannot set `" + o.key + "`: `" + parent_of(walked) + "` is " +
                                                   with_article(node->kind_name()) + ", not a mapping");
    }
  }
  if (!node->is_map() && !node->is_list())
    throw Error("override `" + o.text + "`", "cannot set `" + o.key + "`: `" + walked + "` is " +
                                                 with_article(node->kind_name()) + ", not a mapping");
  const std::string& last = parts.back();
  ConfigNode* existing = node->is_map() ? node->find(last) : node->find_path(last);
  if (node->is_list() && existing == nullptr)
    throw Error("override `" + o.text + "`", "`" + o.key + "`: list index out of range");
  if (existing != nullptr && existing->is_component() && o.value.is_string()) {
    existing->set("_component_", o.value);  // model=torchtune.models.x: siblings kept
    return;
  }
  if (existing != nullptr) {
    merge_into(*existing, o.value);
  } else {
    node->set(last, o.value);
  }
}

static void apply_delete(ConfigNode& tree, const ConfigOverride& o) {
  std::vector<std::string> parts = split_path(o.key);
  std::vector<ConfigNode*> chain{&tree};
  for (const std::string& part : parts) {
    ConfigNode* next = chain.back()->is_map() ? chain.back()->find(part) : nullptr;
    if (next == nullptr) {
      std::string message = "could not find key `" + o.key + "` in the config to remove";
      throw Error("override `" + o.text + "`", message + did_you_mean(o.key, all_key_paths(tree)));
    }
    chain.push_back(next);
  }
  if (chain.back()->is_component())
    throw Error("override `" + o.text + "`", "removing components from the command line is not supported");
  chain[chain.size() - 2]->erase(parts.back());
  // Maps emptied by the deletion go too (torchtune's _remove_key_by_dotpath).
  for (std::size_t i = parts.size() - 1; i >= 1; --i) {
    ConfigNode* n = chain[i];
    if (!(n->is_map() && n->entries().empty())) break;
    chain[i - 1]->erase(parts[i - 1]);
  }
}

void apply_overrides(ConfigNode& tree, const std::vector<std::string>& args) {
  // As torchtune's _merge_yaml_and_cli_args: every `~key` removes from the config file's tree first,
  // then the `key=value`s merge in order (so `k=5 ~k` leaves k = 5, and `~k` of a key only the
  // command line sets is an error).
  std::vector<Error> errors;
  std::vector<ConfigOverride> sets;
  for (const std::string& arg : args) {
    try {
      ConfigOverride o = parse_override(arg);
      if (o.op == ConfigOverride::Op::Delete)
        apply_delete(tree, o);
      else
        sets.push_back(std::move(o));
    } catch (const Error& e) {
      errors.push_back(e);
    }
  }
  for (const ConfigOverride& o : sets) {
    try {
      apply_set(tree, o);
    } catch (const Error& e) {
      errors.push_back(e);
    }
  }
  if (!errors.empty()) throw Errors(std::move(errors));
}

}  // namespace ktune::train
