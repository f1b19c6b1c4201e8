// Python's json encoder (json/encoder.py, the pure-Python path it is equivalent to).
#include "text/jinja/json_dumps.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "text/jinja/template_error.h"
#include "text/unicode_text.h"

namespace ktune::jinja {

namespace {

void append_hex4(std::string& out, unsigned v) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "\\u%04x", v);
  out += buf;
}

std::string encode_string(const std::string& s, bool ensure_ascii) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size();) {
    unsigned char c = (unsigned char)s[i];
    switch (c) {
      case '"': out += "\\\""; ++i; continue;
      case '\\': out += "\\\\"; ++i; continue;
      case '\n': out += "\\n"; ++i; continue;
      case '\r': out += "\\r"; ++i; continue;
      case '\t': out += "\\t"; ++i; continue;
      case '\b': out += "\\b"; ++i; continue;
      case '\f': out += "\\f"; ++i; continue;
      default: break;
    }
    if (c < 0x20 || (ensure_ascii && c == 0x7F)) {
      append_hex4(out, c);
      ++i;
      continue;
    }
    if (c < 0x80 || !ensure_ascii) {
      out += char(c);
      ++i;
      continue;
    }
    char32_t cp;
    i += size_t(text::utf8_decode(s, i, &cp));
    if (cp > 0xFFFF) {
      unsigned v = unsigned(cp) - 0x10000;
      append_hex4(out, 0xD800 | (v >> 10));
      append_hex4(out, 0xDC00 | (v & 0x3FF));
    } else {
      append_hex4(out, unsigned(cp));
    }
  }
  return out + "\"";
}

std::string encode_float(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  return python_float_repr(d);
}

[[noreturn]] void not_serializable(const Value& v) {
  type_error("Object of type " + type_name(v) + " is not JSON serializable");
}

class Encoder {
 public:
  explicit Encoder(const JsonDumpOptions& o) : o_(o) {
    item_sep_ = o.item_separator ? *o.item_separator : (o.indent ? "," : ", ");
  }

  void encode(const Value& v, int level, std::string& out) {
    if (level > 200) fail("ValueError: JSON nesting too deep");
    switch (v.kind()) {
      case Value::Kind::kNone: out += "null"; return;
      case Value::Kind::kBool: out += v.as_bool() ? "true" : "false"; return;
      case Value::Kind::kInt: out += std::to_string(v.as_int()); return;
      case Value::Kind::kFloat: out += encode_float(v.as_float()); return;
      case Value::Kind::kString: out += encode_string(v.as_string(), o_.ensure_ascii); return;
      case Value::Kind::kList: encode_list(v.list().items, level, out); return;
      case Value::Kind::kDict: encode_dict(v.dict(), level, out); return;
      default: not_serializable(v);
    }
  }

 private:
  std::string newline_indent(int level) const {
    std::string s = "\n";
    for (int i = 0; i < level; ++i) s += *o_.indent;
    return s;
  }

  void encode_list(const std::vector<Value>& items, int level, std::string& out) {
    if (items.empty()) {
      out += "[]";
      return;
    }
    out += "[";
    std::string separator = item_sep_;
    if (o_.indent) {
      std::string nl = newline_indent(level + 1);
      separator += nl;
      out += nl;
    }
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += separator;
      encode(items[i], level + 1, out);
    }
    if (o_.indent) out += newline_indent(level);
    out += "]";
  }

  std::string key_text(const Value& k) const {
    switch (k.kind()) {
      case Value::Kind::kString: return k.as_string();
      case Value::Kind::kFloat: return encode_float(k.as_float());
      case Value::Kind::kBool: return k.as_bool() ? "true" : "false";
      case Value::Kind::kNone: return "null";
      case Value::Kind::kInt: return std::to_string(k.as_int());
      default: type_error("keys must be str, int, float, bool or None, not " + type_name(k));
    }
  }

  void encode_dict(const DictData& dict, int level, std::string& out) {
    if (dict.items.empty()) {
      out += "{}";
      return;
    }
    std::vector<const std::pair<Value, Value>*> items;
    for (const auto& item : dict.items) items.push_back(&item);
    if (o_.sort_keys)
      std::stable_sort(items.begin(), items.end(),
                       [](const auto* a, const auto* b) { return compare(a->first, b->first, "<") < 0; });
    out += "{";
    std::string separator = item_sep_;
    if (o_.indent) {
      std::string nl = newline_indent(level + 1);
      separator += nl;
      out += nl;
    }
    bool first = true;
    for (const auto* item : items) {
      if (!first) out += separator;
      first = false;
      out += encode_string(key_text(item->first), o_.ensure_ascii);
      out += o_.key_separator;
      encode(item->second, level + 1, out);
    }
    if (o_.indent) out += newline_indent(level);
    out += "}";
  }

  const JsonDumpOptions& o_;
  std::string item_sep_;
};

}  // namespace

std::string json_dumps(const Value& value, const JsonDumpOptions& options) {
  std::string out;
  Encoder(options).encode(value, 0, out);
  return out;
}

std::string html_safe_json(std::string json) {
  std::string out;
  out.reserve(json.size());
  for (char c : json) {
    switch (c) {
      case '<': out += "\\u003c"; break;
      case '>': out += "\\u003e"; break;
      case '&': out += "\\u0026"; break;
      case '\'': out += "\\u0027"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace ktune::jinja
