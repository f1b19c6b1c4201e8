// The config tree: typing of plain YAML scalars (OmegaConf's rules), loading through yaml-cpp,
// and a YAML writer whose output reads back to the same tree. See config.h.
#include "train/config.h"

#include <algorithm>

#include <yaml-cpp/yaml.h>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <regex>
#include <sstream>

#include "core/error.h"

namespace ktune::train {

// ---------------------------------------------------------------------------------------------
// Construction and access

ConfigNode ConfigNode::boolean(bool value) {
  ConfigNode n;
  n.kind_ = Kind::Bool;
  n.bool_ = value;
  return n;
}
ConfigNode ConfigNode::integer(std::int64_t value) {
  ConfigNode n;
  n.kind_ = Kind::Int;
  n.int_ = value;
  return n;
}
ConfigNode ConfigNode::number(double value) {
  ConfigNode n;
  n.kind_ = Kind::Float;
  n.float_ = value;
  return n;
}
ConfigNode ConfigNode::string(std::string value) {
  ConfigNode n;
  n.kind_ = Kind::String;
  n.string_ = std::move(value);
  return n;
}
ConfigNode ConfigNode::list(std::vector<ConfigNode> items) {
  ConfigNode n;
  n.kind_ = Kind::List;
  n.items_ = std::move(items);
  return n;
}
ConfigNode ConfigNode::map() {
  ConfigNode n;
  n.kind_ = Kind::Map;
  return n;
}

const char* ConfigNode::kind_name(Kind kind) {
  switch (kind) {
    case Kind::Null: return "null";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "string";
    case Kind::List: return "list";
    case Kind::Map: return "map";
  }
  return "?";
}

static Error wrong_kind(const ConfigNode& n, const char* wanted) {
  return Error(std::string("expected ") + wanted + ", got " + n.kind_name() + " " + n.to_inline());
}

bool ConfigNode::as_bool() const {
  if (kind_ != Kind::Bool) throw wrong_kind(*this, "a bool");
  return bool_;
}
std::int64_t ConfigNode::as_int() const {
  if (kind_ != Kind::Int) throw wrong_kind(*this, "an int");
  return int_;
}
double ConfigNode::as_float() const {
  if (kind_ == Kind::Int) return static_cast<double>(int_);
  if (kind_ != Kind::Float) throw wrong_kind(*this, "a float");
  return float_;
}
const std::string& ConfigNode::as_string() const {
  if (kind_ != Kind::String) throw wrong_kind(*this, "a string");
  return string_;
}
const std::vector<ConfigNode>& ConfigNode::items() const {
  if (kind_ != Kind::List) throw wrong_kind(*this, "a list");
  return items_;
}
std::vector<ConfigNode>& ConfigNode::items() {
  if (kind_ != Kind::List) throw wrong_kind(*this, "a list");
  return items_;
}
void ConfigNode::push_back(ConfigNode item) { items().push_back(std::move(item)); }

const std::vector<ConfigNode::Entry>& ConfigNode::entries() const {
  if (kind_ != Kind::Map) throw wrong_kind(*this, "a map");
  return entries_;
}
std::vector<ConfigNode::Entry>& ConfigNode::entries() {
  if (kind_ != Kind::Map) throw wrong_kind(*this, "a map");
  return entries_;
}
const ConfigNode* ConfigNode::find(std::string_view key) const {
  if (kind_ != Kind::Map) return nullptr;
  for (const Entry& e : entries_)
    if (e.first == key) return &e.second;
  return nullptr;
}
ConfigNode* ConfigNode::find(std::string_view key) {
  return const_cast<ConfigNode*>(static_cast<const ConfigNode*>(this)->find(key));
}
ConfigNode& ConfigNode::set(std::string_view key, ConfigNode value) {
  if (ConfigNode* existing = find(key)) {
    *existing = std::move(value);
    return *existing;
  }
  entries().emplace_back(std::string(key), std::move(value));
  return entries_.back().second;
}
bool ConfigNode::erase(std::string_view key) {
  if (kind_ != Kind::Map) return false;
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->first == key) {
      entries_.erase(it);
      return true;
    }
  }
  return false;
}
bool ConfigNode::is_component() const {
  const ConfigNode* c = find("_component_");
  return c != nullptr;
}
std::string ConfigNode::component() const {
  const ConfigNode* c = find("_component_");
  return c != nullptr && c->is_string() ? c->string_ : std::string();
}

const ConfigNode* ConfigNode::find_path(std::string_view dotted) const {
  const ConfigNode* node = this;
  std::size_t start = 0;
  while (node != nullptr) {
    std::size_t dot = dotted.find('.', start);
    std::string_view part = dotted.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start);
    if (node->is_map()) {
      node = node->find(part);
    } else if (node->is_list()) {
      std::size_t index = 0;
      auto [p, ec] = std::from_chars(part.data(), part.data() + part.size(), index);
      if (ec != std::errc() || p != part.data() + part.size() || index >= node->items_.size()) return nullptr;
      node = &node->items_[index];
    } else {
      return nullptr;
    }
    if (dot == std::string_view::npos) return node;
    start = dot + 1;
  }
  return nullptr;
}
ConfigNode* ConfigNode::find_path(std::string_view dotted) {
  return const_cast<ConfigNode*>(static_cast<const ConfigNode*>(this)->find_path(dotted));
}

bool ConfigNode::operator==(const ConfigNode& o) const {
  if (kind_ != o.kind_) return false;
  switch (kind_) {
    case Kind::Null: return true;
    case Kind::Bool: return bool_ == o.bool_;
    case Kind::Int: return int_ == o.int_;
    case Kind::Float: return (std::isnan(float_) && std::isnan(o.float_)) || float_ == o.float_;
    case Kind::String: return string_ == o.string_;
    case Kind::List: return items_ == o.items_;
    case Kind::Map: return entries_ == o.entries_;
  }
  return false;
}

// ---------------------------------------------------------------------------------------------
// Typing of plain scalars (PyYAML's SafeLoader resolvers, with OmegaConf's float regex, which also
// accepts "1e-4" without a dot, and without timestamps).

static const std::regex& null_re() {
  static const std::regex re("^(?:~|null|Null|NULL|)$");
  return re;
}
static const std::regex& bool_re() {
  static const std::regex re("^(?:yes|Yes|YES|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF)$");
  return re;
}
static const std::regex& int_re() {
  static const std::regex re(
      "^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+"
      "|[-+]?[1-9][0-9_]*(?::[0-5]?[0-9])+)$");
  return re;
}
static const std::regex& float_re() {
  static const std::regex re(
      "^(?:[-+]?(?:[0-9][0-9_]*)\\.[0-9_]*(?:[eE][-+]?[0-9]+)?"
      "|[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)"
      "|\\.[0-9_]+(?:[eE][-+][0-9]+)?"
      "|[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\\.[0-9_]*"
      "|[-+]?\\.(?:inf|Inf|INF)"
      "|\\.(?:nan|NaN|NAN))$");
  return re;
}

static std::string without_underscores(const std::string& s) {
  std::string out;
  for (char c : s)
    if (c != '_') out += c;
  return out;
}

// Parses digits in `base`; returns false on overflow (the value then stays a string).
static bool parse_integer(const std::string& digits, int base, std::int64_t& out) {
  if (digits.empty()) return false;
  auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), out, base);
  return ec == std::errc() && p == digits.data() + digits.size();
}

static bool construct_int(const std::string& text, std::int64_t& out) {
  std::string v = without_underscores(text);
  int sign = 1;
  if (!v.empty() && (v[0] == '-' || v[0] == '+')) {
    if (v[0] == '-') sign = -1;
    v = v.substr(1);
  }
  std::int64_t magnitude = 0;
  bool ok;
  if (v == "0") {
    ok = true;
  } else if (v.rfind("0b", 0) == 0) {
    ok = parse_integer(v.substr(2), 2, magnitude);
  } else if (v.rfind("0x", 0) == 0) {
    ok = parse_integer(v.substr(2), 16, magnitude);
  } else if (v[0] == '0') {
    ok = parse_integer(v.substr(1), 8, magnitude);
  } else if (v.find(':') != std::string::npos) {
    ok = true;
    std::int64_t base = 1;
    std::vector<std::int64_t> parts;
    std::stringstream ss(v);
    std::string part;
    while (std::getline(ss, part, ':')) {
      std::int64_t x = 0;
      if (!parse_integer(part, 10, x)) ok = false;
      parts.push_back(x);
    }
    for (auto it = parts.rbegin(); it != parts.rend(); ++it, base *= 60) magnitude += *it * base;
  } else {
    ok = parse_integer(v, 10, magnitude);
  }
  out = sign * magnitude;
  return ok;
}

static double construct_float(const std::string& text) {
  std::string v = without_underscores(text);
  for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double sign = 1.0;
  if (!v.empty() && (v[0] == '-' || v[0] == '+')) {
    if (v[0] == '-') sign = -1.0;
    v = v.substr(1);
  }
  if (v == ".inf") return sign * std::numeric_limits<double>::infinity();
  if (v == ".nan") return std::numeric_limits<double>::quiet_NaN();
  if (v.find(':') != std::string::npos) {
    double value = 0, base = 1;
    std::vector<std::string> parts;
    std::stringstream ss(v);
    std::string part;
    while (std::getline(ss, part, ':')) parts.push_back(part);
    for (auto it = parts.rbegin(); it != parts.rend(); ++it, base *= 60) value += std::stod(*it) * base;
    return sign * value;
  }
  return sign * std::strtod(v.c_str(), nullptr);
}

ConfigNode type_plain_scalar(const std::string& text) {
  if (std::regex_match(text, null_re())) return ConfigNode::null();
  if (std::regex_match(text, bool_re())) {
    char c = text[0];
    return ConfigNode::boolean(c == 'y' || c == 'Y' || c == 't' || c == 'T' || text == "on" || text == "On" ||
                               text == "ON");
  }
  if (std::regex_match(text, int_re())) {
    std::int64_t value = 0;
    if (construct_int(text, value)) return ConfigNode::integer(value);
    return ConfigNode::string(text);  // out of int64 range: kept verbatim
  }
  if (std::regex_match(text, float_re())) return ConfigNode::number(construct_float(text));
  return ConfigNode::string(text);
}

// ---------------------------------------------------------------------------------------------
// Loading through yaml-cpp

static std::string place(const std::string& source, const YAML::Mark& mark) {
  if (mark.line < 0) return source;
  return source + ":" + std::to_string(mark.line + 1) + ":" + std::to_string(mark.column + 1);
}

// "source:line", the origin of a value written at mark.
static std::string line_of(const std::string& source, const YAML::Mark& mark) {
  return mark.line < 0 ? source : source + ":" + std::to_string(mark.line + 1);
}

static ConfigNode convert(const YAML::Node& node, const std::string& source) {
  switch (node.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null:
      return ConfigNode::null();
    case YAML::NodeType::Scalar: {
      const std::string& tag = node.Tag();
      const std::string& text = node.Scalar();
      if (tag == "?") return type_plain_scalar(text);
      if (tag == "!" || tag == "tag:yaml.org,2002:str") return ConfigNode::string(text);
      ConfigNode typed = type_plain_scalar(text);
      if (tag == "tag:yaml.org,2002:int" && typed.is_int()) return typed;
      if (tag == "tag:yaml.org,2002:float" && typed.is_number()) return ConfigNode::number(typed.as_float());
      if (tag == "tag:yaml.org,2002:bool" && typed.is_bool()) return typed;
      if (tag == "tag:yaml.org,2002:null" && typed.is_null()) return typed;
      throw Error(place(source, node.Mark()), "unsupported YAML tag '" + tag + "' on value '" + text + "'");
    }
    case YAML::NodeType::Sequence: {
      ConfigNode list = ConfigNode::list();
      for (const YAML::Node& item : node) {
        list.push_back(convert(item, source));
        list.items().back().set_origin(line_of(source, item.Mark()));
      }
      return list;
    }
    case YAML::NodeType::Map: {
      // A key twice in one mapping is refused, as OmegaConf's loader refuses it (torchtune's
      // configs): a second `epochs:` further down a copied config would otherwise win unseen.
      ConfigNode map = ConfigNode::map();
      std::map<std::string, YAML::Mark> first_seen;
      for (const auto& kv : node) {
        if (!kv.first.IsScalar())
          throw Error(place(source, kv.first.Mark()), "a config key must be a plain string, not a collection");
        const std::string& key = kv.first.Scalar();
        if (const auto [it, fresh] = first_seen.emplace(key, kv.first.Mark()); !fresh)
          throw Error(place(source, kv.first.Mark()),
                      "duplicate key '" + key + "' (first at " + place(source, it->second) + "): give it once");
        map.set(key, convert(kv.second, source)).set_origin(line_of(source, kv.first.Mark()));
      }
      return map;
    }
  }
  return ConfigNode::null();
}

ConfigNode load_config_yaml(const std::string& text, const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw Error(place(source, e.mark), "YAML syntax error: " + e.msg);
  }
  ConfigNode tree = convert(root, source);
  if (tree.is_null()) return ConfigNode::map();  // an empty file is an empty config
  if (!tree.is_map()) throw Error(source, std::string("a config must be a YAML mapping, not a ") + tree.kind_name());
  return tree;
}

ConfigNode load_config_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path, "cannot open config file");
  std::stringstream ss;
  ss << in.rdbuf();
  return load_config_yaml(ss.str(), path);
}

// ---------------------------------------------------------------------------------------------
// Writing YAML

static std::string format_float(double v) {
  if (std::isnan(v)) return ".nan";
  if (std::isinf(v)) return v > 0 ? ".inf" : "-.inf";
  char buf[64];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  std::string s = buf;
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

// Whether `s` can be written unquoted and reads back as this same string.
static bool plain_safe(const std::string& s, bool in_flow) {
  if (s.empty() || s.front() == ' ' || s.back() == ' ') return false;
  if (!type_plain_scalar(s).is_string()) return false;
  static const std::string kIndicators = "-?:,[]{}#&*!|>'\"%@`";
  if (kIndicators.find(s.front()) != std::string::npos) {
    // "-x", "?x", ":x" are plain when not followed by a space; keep it simple and quote them.
    return false;
  }
  for (unsigned char c : s)
    if (c < 0x20 || c == 0x7f) return false;
  if (s.find(": ") != std::string::npos || s.find(" #") != std::string::npos || s.back() == ':') return false;
  if (in_flow && s.find_first_of(",[]{}") != std::string::npos) return false;
  return true;
}

static std::string quote(const std::string& s) {
  bool needs_double = false;
  for (unsigned char c : s)
    if (c < 0x20 || c == 0x7f) needs_double = true;
  if (!needs_double) {
    std::string out = "'";
    for (char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
    return out + "'";
  }
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\x%02x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

static std::string scalar_text(const ConfigNode& n, bool in_flow) {
  switch (n.kind()) {
    case ConfigNode::Kind::Null: return "null";
    case ConfigNode::Kind::Bool: return n.as_bool() ? "true" : "false";
    case ConfigNode::Kind::Int: return std::to_string(n.as_int());
    case ConfigNode::Kind::Float: return format_float(n.as_float());
    case ConfigNode::Kind::String: {
      const std::string& s = n.as_string();
      return plain_safe(s, in_flow) ? s : quote(s);
    }
    default: return "";
  }
}

static std::string flow_text(const ConfigNode& n) {
  if (n.is_list()) {
    std::string out = "[";
    for (std::size_t i = 0; i < n.items().size(); ++i) out += (i ? ", " : "") + flow_text(n.items()[i]);
    return out + "]";
  }
  if (n.is_map()) {
    std::string out = "{";
    bool first = true;
    for (const auto& [k, v] : n.entries()) {
      out += (first ? "" : ", ") + scalar_text(ConfigNode::string(k), true) + ": " + flow_text(v);
      first = false;
    }
    return out + "}";
  }
  return scalar_text(n, true);
}

std::string ConfigNode::to_inline() const { return is_scalar() ? scalar_text(*this, false) : flow_text(*this); }

static bool all_scalars(const ConfigNode& list) {
  for (const ConfigNode& item : list.items())
    if (!item.is_scalar()) return false;
  return true;
}

static void write_block(const ConfigNode& n, int indent, std::string& out);

// Writes the value part after "key:" (or "-"), choosing inline or a nested block.
static void write_value(const ConfigNode& v, int indent, std::string& out) {
  if (v.is_map() && !v.entries().empty()) {
    out += "\n";
    write_block(v, indent + 2, out);
  } else if (v.is_list() && !v.items().empty() && !all_scalars(v)) {
    out += "\n";
    write_block(v, indent + 2, out);
  } else {
    out += " " + (v.is_scalar() ? scalar_text(v, false) : flow_text(v)) + "\n";
  }
}

static void write_block(const ConfigNode& n, int indent, std::string& out) {
  std::string pad(static_cast<std::size_t>(indent), ' ');
  if (n.is_map()) {
    for (const auto& [k, v] : n.entries()) {
      out += pad + scalar_text(ConfigNode::string(k), false) + ":";
      write_value(v, indent, out);
    }
  } else if (n.is_list()) {
    for (const ConfigNode& item : n.items()) {
      if (item.is_map() && !item.entries().empty()) {
        // "- key: v" then the other keys aligned under the first.
        std::string nested;
        write_block(item, indent + 2, nested);
        out += pad + "-" + nested.substr(static_cast<std::size_t>(indent) + 1);
      } else {
        out += pad + "-";
        write_value(item, indent, out);
      }
    }
  }
}

void ConfigNode::sort_keys() {
  if (is_map()) {
    std::sort(entries_.begin(), entries_.end(), [](const Entry& a, const Entry& b) { return a.first < b.first; });
    for (Entry& e : entries_) e.second.sort_keys();
  } else if (is_list()) {
    for (ConfigNode& item : items_) item.sort_keys();
  }
}

std::string ConfigNode::to_yaml() const {
  if (!is_map() && !is_list()) return scalar_text(*this, false) + "\n";
  if (is_map() && entries().empty()) return "{}\n";
  std::string out;
  write_block(*this, 0, out);
  return out;
}

}  // namespace ktune::train
