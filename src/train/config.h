// The config tree that recipes read: a YAML document with its scalars typed the way torchtune
// (OmegaConf's YAML 1.1 loader) types them, so that `lr: 3e-4` is a float, `True` a bool,
// `max_filename: "00030"` a string and `00030` the octal integer 24, exactly as torchtune sees them.
//
// This file holds the tree, loading it from YAML text (yaml-cpp does the syntax; the typing of
// plain scalars is ours) and writing it back as YAML. Command-line overrides live in
// config_overrides.h, `${…}` interpolation in config_interpolation.h, checking against a recipe's
// schema in config_schema.h. It deliberately knows nothing about recipes or components.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ktune::train {

class ConfigNode {
 public:
  enum class Kind { Null, Bool, Int, Float, String, List, Map };
  using Entry = std::pair<std::string, ConfigNode>;

  ConfigNode() = default;  // null
  static ConfigNode null() { return ConfigNode(); }
  static ConfigNode boolean(bool value);
  static ConfigNode integer(std::int64_t value);
  static ConfigNode number(double value);
  static ConfigNode string(std::string value);
  static ConfigNode list(std::vector<ConfigNode> items = {});
  static ConfigNode map();

  Kind kind() const { return kind_; }
  bool is_null() const { return kind_ == Kind::Null; }
  bool is_bool() const { return kind_ == Kind::Bool; }
  bool is_int() const { return kind_ == Kind::Int; }
  bool is_float() const { return kind_ == Kind::Float; }
  bool is_number() const { return kind_ == Kind::Int || kind_ == Kind::Float; }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_list() const { return kind_ == Kind::List; }
  bool is_map() const { return kind_ == Kind::Map; }
  bool is_scalar() const { return kind_ != Kind::List && kind_ != Kind::Map; }

  // Accessors throw ktune::Error naming the kind found when the node is not of the asked kind.
  bool as_bool() const;
  std::int64_t as_int() const;
  double as_float() const;  // an Int is widened
  const std::string& as_string() const;

  // Lists.
  const std::vector<ConfigNode>& items() const;
  std::vector<ConfigNode>& items();
  void push_back(ConfigNode item);

  // Maps keep the order of their keys (the order of the file, new keys appended).
  const std::vector<Entry>& entries() const;
  std::vector<Entry>& entries();
  bool contains(std::string_view key) const { return find(key) != nullptr; }
  const ConfigNode* find(std::string_view key) const;
  ConfigNode* find(std::string_view key);
  ConfigNode& set(std::string_view key, ConfigNode value);  // replaces or appends
  bool erase(std::string_view key);
  // A map with a `_component_` key (torchtune's mark of an instantiable object).
  bool is_component() const;
  // The `_component_` string of a component node, "" otherwise.
  std::string component() const;

  // Dotted paths "a.b.c" through maps (a list index is written as a number: "a.0.b").
  const ConfigNode* find_path(std::string_view dotted) const;
  ConfigNode* find_path(std::string_view dotted);

  // "null", "bool", "int", "float", "string", "list", "map": used in error messages.
  static const char* kind_name(Kind kind);
  const char* kind_name() const { return kind_name(kind_); }

  // The value as a one-line string: scalars as YAML would write them ("true", "3e-04", "a b"),
  // collections in flow style ({a: 1, b: [x, y]}). Used in messages and interpolation.
  std::string to_inline() const;
  // The tree as a block-style YAML document that load_config_yaml() reads back to an equal tree.
  std::string to_yaml() const;
  // Every map's keys in lexical order, all the way down (`tune cat --sort`, the logged config).
  void sort_keys();

  // Where the value was written: "config.yaml:12" (the line of its key, or of the list item) for a
  // value read from a file, "override `key=value`" for one set on the command line, "" otherwise.
  // Schema errors name it; it is not part of the value (== ignores it).
  const std::string& origin() const { return origin_; }
  void set_origin(std::string origin) { origin_ = std::move(origin); }

  bool operator==(const ConfigNode& other) const;
  bool operator!=(const ConfigNode& other) const { return !(*this == other); }

 private:
  Kind kind_ = Kind::Null;
  bool bool_ = false;
  std::int64_t int_ = 0;
  double float_ = 0.0;
  std::string string_;
  std::vector<ConfigNode> items_;
  std::vector<Entry> entries_;
  std::string origin_;
};

// Types a plain (unquoted) YAML scalar as OmegaConf's loader does: null (~, null, empty), bool
// (true/false/yes/no/on/off in their three casings), int (decimal, 0x, 0b, YAML 1.1 leading-0
// octal, sexagesimal, `_` separators), float (with or without a dot in the mantissa: 3e-4, .inf,
// .nan, 1.5), otherwise a string.
ConfigNode type_plain_scalar(const std::string& text);

// Parses YAML text into a config tree. `source` names the text in errors ("llama3_2/1B_full.yaml");
// YAML syntax errors carry its line and column. Anchors and aliases are expanded; tags other than
// !!str, !!int, !!float, !!bool, !!null are refused.
ConfigNode load_config_yaml(const std::string& text, const std::string& source);
ConfigNode load_config_file(const std::string& path);

}  // namespace ktune::train
