// Resolution of `${…}` interpolations in a config tree. See config_interpolation.h.
#include "train/config_interpolation.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <utility>

#include "core/error.h"
#include "train/config_suggest.h"

namespace ktune::train {

bool has_interpolation(const std::string& text) {
  for (std::size_t i = text.find("${"); i != std::string::npos; i = text.find("${", i + 1))
    if (i == 0 || text[i - 1] != '\\') return true;
  return false;
}

std::string python_str(const ConfigNode& n) {
  switch (n.kind()) {
    case ConfigNode::Kind::Null: return "None";
    case ConfigNode::Kind::Bool: return n.as_bool() ? "True" : "False";
    case ConfigNode::Kind::Int: return std::to_string(n.as_int());
    case ConfigNode::Kind::String: return n.as_string();
    case ConfigNode::Kind::Float: {
      double v = n.as_float();
      if (std::isnan(v)) return "nan";
      if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
      char buf[64];
      for (int precision = 1; precision <= 17; ++precision) {
        std::snprintf(buf, sizeof buf, "%.*g", precision, v);
        if (std::strtod(buf, nullptr) == v) break;
      }
      std::string s = buf;
      // Python's repr switches to an exponent at 1e16, C's %g at the precision: redo large ones.
      if (s.find('e') != std::string::npos && std::fabs(v) >= 1.0 && std::fabs(v) < 1e16) {
        std::snprintf(buf, sizeof buf, "%.1f", v);
        s = buf;
      }
      if (s.find_first_of(".e") == std::string::npos) s += ".0";
      return s;
    }
    default: return n.to_inline();
  }
}

namespace {

struct Segment {
  bool is_interpolation = false;
  std::string text;  // literal text, or the expression inside ${…}
};

// Splits "a${x}b\${y}" into literal and interpolation segments; throws on an unclosed "${".
std::vector<Segment> split_segments(const std::string& s) {
  std::vector<Segment> out;
  std::string literal;
  for (std::size_t i = 0; i < s.size();) {
    if (s[i] == '\\' && s.compare(i, 3, "\\${") == 0) {
      literal += "${";
      i += 3;
    } else if (s.compare(i, 2, "${") == 0) {
      std::size_t close = s.find('}', i + 2);
      if (close == std::string::npos) throw Error("unclosed interpolation in `" + s + "`");
      if (!literal.empty()) out.push_back({false, literal});
      literal.clear();
      out.push_back({true, s.substr(i + 2, close - i - 2)});
      i = close + 1;
    } else {
      literal += s[i++];
    }
  }
  if (!literal.empty()) out.push_back({false, literal});
  return out;
}

std::string trim(const std::string& text) {
  std::size_t b = text.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return text.substr(b, text.find_last_not_of(" \t") - b + 1);
}

// A key with OmegaConf's list indexing, `a.x[1].y`, as the dotted path `a.x.1.y`.
std::string key_path(const std::string& key) {
  std::string out;
  for (char c : key) {
    if (c == '[') out += '.';
    else if (c != ']') out += c;
  }
  return out;
}

// A resolver's "first,default" arguments: the first trimmed, the default (when given) typed as a YAML
// plain scalar, or the text inside its quotes.
std::pair<std::string, std::optional<ConfigNode>> resolver_arguments(const std::string& args) {
  std::size_t comma = args.find(',');
  std::string first = trim(args.substr(0, comma));
  if (comma == std::string::npos) return {first, std::nullopt};
  std::string fallback = trim(args.substr(comma + 1));
  if (fallback.size() >= 2 && (fallback.front() == '\'' || fallback.front() == '"') && fallback.back() == fallback.front())
    return {first, ConfigNode::string(fallback.substr(1, fallback.size() - 2))};
  return {first, fallback.empty() ? ConfigNode::string("") : type_plain_scalar(fallback)};
}

std::string parent_path(const std::string& path) {
  std::size_t dot = path.rfind('.');
  return dot == std::string::npos ? std::string() : path.substr(0, dot);
}

class Resolver {
 public:
  explicit Resolver(ConfigNode& root) : root_(root) {}

  void run() {
    resolve_subtree("");
    if (!errors_.empty()) throw Errors(std::move(errors_));
  }

 private:
  enum class State { InProgress, Done };

  ConfigNode* node_at(const std::string& path) { return path.empty() ? &root_ : root_.find_path(path); }

  void resolve_subtree(const std::string& path) {
    ConfigNode* node = node_at(path);
    if (node == nullptr) return;
    if (node->is_string()) {
      resolve_string(path);
    } else if (node->is_map()) {
      std::vector<std::string> keys;
      for (const auto& e : node->entries()) keys.push_back(e.first);
      for (const std::string& k : keys) resolve_subtree(path.empty() ? k : path + "." + k);
    } else if (node->is_list()) {
      std::size_t n = node->items().size();
      for (std::size_t i = 0; i < n; ++i) resolve_subtree((path.empty() ? "" : path + ".") + std::to_string(i));
    }
  }

  // The absolute path an expression names, seen from the string at `holder`.
  std::string target_path(const std::string& expr, const std::string& holder) {
    if (expr.empty() || expr[0] != '.') return expr;
    std::size_t dots = expr.find_first_not_of('.');
    std::string base = parent_path(holder);
    for (std::size_t i = 1; i < dots; ++i) base = parent_path(base);
    std::string rest = expr.substr(dots == std::string::npos ? expr.size() : dots);
    return base.empty() ? rest : (rest.empty() ? base : base + "." + rest);
  }

  ConfigNode evaluate(const std::string& raw_expr, const std::string& holder) {
    const std::string expr = trim(raw_expr);  // OmegaConf allows `${ a.b }`
    if (expr.rfind("oc.env:", 0) == 0) {
      auto [name, fallback] = resolver_arguments(expr.substr(7));
      // OmegaConf's oc.env gives a string: the variable's value, or str() of its default (None stays None).
      if (const char* value = std::getenv(name.c_str())) return ConfigNode::string(value);
      if (fallback) return fallback->is_null() ? *fallback : ConfigNode::string(python_str(*fallback));
      throw Error("environment variable " + name + " is not set (in ${" + expr + "})");
    }
    if (expr.rfind("oc.select:", 0) == 0) {
      // OmegaConf's oc.select: the key's value (typed), or the default when the key is absent (None
      // without one).
      auto [key, fallback] = resolver_arguments(expr.substr(10));
      if (node_at(target_path(key_path(key), holder)) == nullptr) return fallback ? *fallback : ConfigNode();
      return evaluate(key, holder);
    }
    if (expr.find(':') != std::string::npos)
      throw Error("unsupported resolver in ${" + expr + "} (ktune supports oc.env and oc.select)");
    std::string target = target_path(key_path(expr), holder);
    if (state_.count(target) && state_[target] == State::InProgress) throw Error(cycle_message(target));
    if (node_at(target) == nullptr)
      throw Error("interpolation ${" + expr + "}: key `" + target + "` not found" +
                  did_you_mean(target, all_key_paths(root_)));
    for (const std::string& open : stack_)  // an ancestor of the holder being resolved
      if (target.empty() || open == target || open.rfind(target + ".", 0) == 0) throw Error(cycle_message(target));
    stack_.push_back(target);
    state_[target] = State::InProgress;
    resolve_subtree(target);
    state_[target] = State::Done;
    stack_.pop_back();
    return *node_at(target);
  }

  std::string cycle_message(const std::string& target) {
    std::string chain;
    for (const std::string& s : stack_) chain += s + " -> ";
    return "interpolation cycle: " + chain + target;
  }

  void resolve_string(const std::string& path) {
    if (state_.count(path) && state_[path] == State::Done) return;
    ConfigNode* node = node_at(path);
    if (!has_interpolation(node->as_string()) && node->as_string().find("\\${") == std::string::npos) {
      state_[path] = State::Done;
      return;
    }
    state_[path] = State::InProgress;
    stack_.push_back(path);
    try {
      std::vector<Segment> segments = split_segments(node->as_string());
      ConfigNode result;
      if (segments.size() == 1 && segments[0].is_interpolation) {
        result = evaluate(segments[0].text, path);
      } else {
        std::string text;
        for (const Segment& s : segments) {
          if (!s.is_interpolation) {
            text += s.text;
            continue;
          }
          ConfigNode value = evaluate(s.text, path);
          if (!value.is_scalar())
            throw Error("${" + s.text + "} is a " + std::string(value.kind_name()) + " and cannot be part of a string");
          text += python_str(value);
        }
        result = ConfigNode::string(text);
      }
      *node_at(path) = result;
    } catch (const Error& e) {
      errors_.emplace_back("config key " + path, e.what());
    }
    stack_.pop_back();
    state_[path] = State::Done;
  }

  ConfigNode& root_;
  std::map<std::string, State> state_;
  std::vector<std::string> stack_;
  std::vector<Error> errors_;
};

}  // namespace

void resolve_interpolations(ConfigNode& tree) { Resolver(tree).run(); }

}  // namespace ktune::train
