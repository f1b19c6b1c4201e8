// Python's builtins on the engine's values: bool(), str(), repr(), ==, ordering, len(), iter().
#include "text/jinja/value.h"

#include <utf8proc.h>

#include <charconv>
#include <cmath>
#include <cstdio>

#include "text/jinja/python_str.h"
#include "text/jinja/template_error.h"
#include "text/unicode_text.h"

namespace ktune::jinja {

const Value* DictData::find(const Value& key) const {
  for (const auto& [k, v] : items)
    if (equals(k, key)) return &v;
  return nullptr;
}

void DictData::set(const Value& key, Value value) {
  for (auto& [k, v] : items)
    if (equals(k, key)) {
      v = std::move(value);
      return;
    }
  items.emplace_back(key, std::move(value));
}

bool DictData::erase(const Value& key) {
  for (auto it = items.begin(); it != items.end(); ++it)
    if (equals(it->first, key)) {
      items.erase(it);
      return true;
    }
  return false;
}

const Value* ObjectData::find(std::string_view name) const {
  for (const auto& [k, v] : attrs)
    if (k == name) return &v;
  return nullptr;
}

void ObjectData::set(const std::string& name, Value value) {
  for (auto& [k, v] : attrs)
    if (k == name) {
      v = std::move(value);
      return;
    }
  attrs.emplace_back(name, std::move(value));
}

Value Value::undefined(std::string hint, bool strict, bool unsafe) {
  Value v;
  v.string_ = std::move(hint);
  v.strict_ = strict;
  v.unsafe_ = unsafe;
  return v;
}
Value Value::none() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}
Value Value::boolean(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.bool_ = b;
  return v;
}
Value Value::integer(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.int_ = i;
  return v;
}
Value Value::number(double d) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.float_ = d;
  return v;
}
Value Value::string(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.string_ = std::move(s);
  return v;
}
Value Value::markup(std::string s) {
  Value v = string(std::move(s));
  v.markup_ = true;
  return v;
}
Value Value::new_list(std::vector<Value> items) {
  Value v;
  v.kind_ = Kind::kList;
  v.list_ = std::make_shared<ListData>();
  v.list_->items = std::move(items);
  return v;
}
Value Value::new_tuple(std::vector<Value> items) {
  Value v = new_list(std::move(items));
  v.list_->is_tuple = true;
  return v;
}
Value Value::new_dict() {
  Value v;
  v.kind_ = Kind::kDict;
  v.dict_ = std::make_shared<DictData>();
  return v;
}
Value Value::new_object(std::string type_name, bool assignable) {
  Value v;
  v.kind_ = Kind::kObject;
  v.object_ = std::make_shared<ObjectData>();
  v.object_->type_name = std::move(type_name);
  v.object_->assignable = assignable;
  return v;
}
Value Value::callable(std::string name, NativeFunction fn) {
  Value v;
  v.kind_ = Kind::kCallable;
  v.callable_ = std::make_shared<CallableData>(CallableData{std::move(name), std::move(fn)});
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& json) {
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null: return none();
    case nlohmann::ordered_json::value_t::boolean: return boolean(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return integer(json.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      uint64_t u = json.get<uint64_t>();
      return u <= uint64_t(INT64_MAX) ? integer(int64_t(u)) : number(double(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return number(json.get<double>());
    case nlohmann::ordered_json::value_t::string: return string(json.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(json.size());
      for (const auto& item : json) items.push_back(from_json(item));
      return new_list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Value d = new_dict();
      for (auto it = json.begin(); it != json.end(); ++it) d.dict_->items.emplace_back(string(it.key()), from_json(it.value()));
      return d;
    }
    default: return none();  // binary and discarded values do not come from parsed JSON
  }
}

double Value::as_float() const {
  if (kind_ == Kind::kFloat) return float_;
  return double(as_int());
}

void Value::fail_undefined() const {
  fail((unsafe_ ? "SecurityError: " : "UndefinedError: ") + (string_.empty() ? std::string("undefined value") : string_));
}

bool Value::same_as(const Value& other) const {
  if (kind_ != other.kind_) return false;
  switch (kind_) {
    case Kind::kNone: return true;
    case Kind::kBool: return bool_ == other.bool_;
    case Kind::kInt: return int_ == other.int_;
    case Kind::kFloat: return false;
    case Kind::kString: return string_ == other.string_;
    case Kind::kList: return list_ == other.list_;
    case Kind::kDict: return dict_ == other.dict_;
    case Kind::kObject: return object_ == other.object_;
    case Kind::kCallable: return callable_ == other.callable_;
    case Kind::kUndefined: return false;
  }
  return false;
}

std::string type_name(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return v.strict_undefined() ? "StrictUndefined" : "Undefined";
    case Value::Kind::kNone: return "NoneType";
    case Value::Kind::kBool: return "bool";
    case Value::Kind::kInt: return "int";
    case Value::Kind::kFloat: return "float";
    case Value::Kind::kString: return v.is_markup() ? "Markup" : "str";
    case Value::Kind::kList: return v.is_tuple() ? "tuple" : "list";
    case Value::Kind::kDict: return "dict";
    case Value::Kind::kObject: return v.object().type_name;
    case Value::Kind::kCallable: return "function";
  }
  return "object";
}

std::string object_type_repr(const Value& v) {
  if (v.is_none()) return "None";
  return type_name(v) + " object";
}

bool truthy(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      if (v.strict_undefined()) v.fail_undefined();
      return false;
    case Value::Kind::kNone: return false;
    case Value::Kind::kBool: return v.as_bool();
    case Value::Kind::kInt: return v.as_int() != 0;
    case Value::Kind::kFloat: return v.as_float() != 0.0;
    case Value::Kind::kString: return !v.as_string().empty();
    case Value::Kind::kList: return !v.list().items.empty();
    case Value::Kind::kDict: return !v.dict().items.empty();
    case Value::Kind::kObject:
    case Value::Kind::kCallable: return true;
  }
  return true;
}

std::string python_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // The shortest digits that round-trip, as scientific "d.ddde±x", then Python's layout rule:
  // exponent notation when the decimal exponent is < -4 or >= 16.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  size_t e_at = sci.find('e');
  int exponent = std::stoi(sci.substr(e_at + 1));
  std::string digits;
  for (size_t i = 0; i < e_at; ++i)
    if (sci[i] != '.') digits += sci[i];
  std::string out = negative ? "-" : "";
  if (exponent < -4 || exponent >= 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char exp[16];
    std::snprintf(exp, sizeof exp, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    return out + exp;
  }
  if (exponent < 0) return out + "0." + std::string(size_t(-exponent - 1), '0') + digits;
  size_t int_digits = size_t(exponent) + 1;
  if (digits.size() <= int_digits) return out + digits + std::string(int_digits - digits.size(), '0') + ".0";
  return out + digits.substr(0, int_digits) + "." + digits.substr(int_digits);
}

namespace {

// Python's repr of a str: single quotes unless the text has one and no double quote.
std::string repr_string(const std::string& s) {
  char quote = (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
  std::string out(1, quote);
  for (size_t i = 0; i < s.size();) {
    char32_t cp;
    int n = text::utf8_decode(s, i, &cp);
    std::string_view raw(s.data() + i, size_t(n));
    i += size_t(n);
    if (cp == '\\') out += "\\\\";
    else if (cp == char32_t(quote)) out += std::string("\\") + quote;
    else if (cp == '\n') out += "\\n";
    else if (cp == '\r') out += "\\r";
    else if (cp == '\t') out += "\\t";
    else if (cp < 0x20 || cp == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", unsigned(cp));
      out += buf;
    } else if (cp < 0x80) out += char(cp);
    else {
      utf8proc_category_t c = utf8proc_category(utf8proc_int32_t(cp));
      bool printable = !(c == UTF8PROC_CATEGORY_CC || c == UTF8PROC_CATEGORY_CF || c == UTF8PROC_CATEGORY_CS ||
                         c == UTF8PROC_CATEGORY_CO || c == UTF8PROC_CATEGORY_CN || c == UTF8PROC_CATEGORY_ZL ||
                         c == UTF8PROC_CATEGORY_ZP || c == UTF8PROC_CATEGORY_ZS);
      if (printable) {
        out += raw;
      } else {
        char buf[16];
        if (cp <= 0xFF) std::snprintf(buf, sizeof buf, "\\x%02x", unsigned(cp));
        else if (cp <= 0xFFFF) std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(cp));
        else std::snprintf(buf, sizeof buf, "\\U%08x", unsigned(cp));
        out += buf;
      }
    }
  }
  return out + quote;
}

}  // namespace

std::string repr(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kString: return v.is_markup() ? "Markup(" + repr_string(v.as_string()) + ")" : repr_string(v.as_string());
    case Value::Kind::kUndefined: return "Undefined";
    case Value::Kind::kList: {
      const ListData& l = v.list();
      std::string out = l.is_tuple ? "(" : "[";
      for (size_t i = 0; i < l.items.size(); ++i) out += (i ? ", " : "") + repr(l.items[i]);
      if (l.is_tuple && l.items.size() == 1) out += ",";
      return out + (l.is_tuple ? ")" : "]");
    }
    case Value::Kind::kDict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, item] : v.dict().items) {
        out += (first ? "" : ", ") + repr(k) + ": " + repr(item);
        first = false;
      }
      return out + "}";
    }
    case Value::Kind::kObject: {
      const ObjectData& o = v.object();
      std::string out = "<" + o.type_name + " {";
      for (size_t i = 0; i < o.attrs.size(); ++i)
        out += (i ? ", " : "") + repr_string(o.attrs[i].first) + ": " + repr(o.attrs[i].second);
      return out + "}>";
    }
    case Value::Kind::kCallable: return "<function " + v.callable().name + ">";
    default: return to_str(v);
  }
}

std::string to_str(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      if (v.strict_undefined()) v.fail_undefined();
      return "";
    case Value::Kind::kNone: return "None";
    case Value::Kind::kBool: return v.as_bool() ? "True" : "False";
    case Value::Kind::kInt: return std::to_string(v.as_int());
    case Value::Kind::kFloat: return python_float_repr(v.as_float());
    case Value::Kind::kString: return v.as_string();
    default: return repr(v);
  }
}

bool equals(const Value& a, const Value& b) {
  if (a.is_undefined() || b.is_undefined()) {
    if (a.is_undefined() && a.strict_undefined()) a.fail_undefined();
    if (b.is_undefined() && b.strict_undefined()) b.fail_undefined();
    return a.is_undefined() && b.is_undefined();
  }
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_float() == b.as_float();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kNone: return true;
    case Value::Kind::kString: return a.as_string() == b.as_string();
    case Value::Kind::kList: {
      const ListData &x = a.list(), &y = b.list();
      if (x.is_tuple != y.is_tuple || x.items.size() != y.items.size()) return false;
      for (size_t i = 0; i < x.items.size(); ++i)
        if (!equals(x.items[i], y.items[i])) return false;
      return true;
    }
    case Value::Kind::kDict: {
      const DictData &x = a.dict(), &y = b.dict();
      if (x.items.size() != y.items.size()) return false;
      for (const auto& [k, item] : x.items) {
        const Value* other = y.find(k);
        if (!other || !equals(item, *other)) return false;
      }
      return true;
    }
    default: return a.same_as(b);
  }
}

int compare(const Value& a, const Value& b, const char* op) {
  if (a.is_undefined()) a.fail_undefined();
  if (b.is_undefined()) b.fail_undefined();
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      double x = a.as_float(), y = b.as_float();
      return x < y ? -1 : x > y ? 1 : 0;  // NaN compares as neither: Python's < and > are both false
    }
    int64_t x = a.as_int(), y = b.as_int();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    int c = a.as_string().compare(b.as_string());  // UTF-8 byte order is code point order
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    const auto &x = a.list().items, &y = b.list().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (equals(x[i], y[i])) continue;
      return compare(x[i], y[i], op);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  type_error(std::string("'") + op + "' not supported between instances of '" + type_name(a) + "' and '" +
             type_name(b) + "'");
}

int64_t length(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      if (v.strict_undefined()) v.fail_undefined();
      return 0;
    case Value::Kind::kString: return code_point_count(v.as_string());
    case Value::Kind::kList: return int64_t(v.list().items.size());
    case Value::Kind::kDict: return int64_t(v.dict().items.size());
    default: type_error("object of type '" + type_name(v) + "' has no len()");
  }
}

std::vector<Value> iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      if (v.strict_undefined()) v.fail_undefined();
      return {};
    case Value::Kind::kString: {
      std::vector<Value> out;
      for (std::string& cp : code_points(v.as_string())) out.push_back(Value::string(std::move(cp)));
      return out;
    }
    case Value::Kind::kList: return v.list().items;
    case Value::Kind::kDict: {
      std::vector<Value> out;
      for (const auto& [k, item] : v.dict().items) out.push_back(k);
      return out;
    }
    default: type_error("'" + type_name(v) + "' object is not iterable");
  }
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kString:
      if (item.is_undefined()) item.fail_undefined();
      if (!item.is_string())
        type_error("'in <string>' requires string as left operand, not " + type_name(item));
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Kind::kDict: return container.dict().find(item) != nullptr;
    case Value::Kind::kUndefined:
    case Value::Kind::kList:
      for (const Value& x : iterate(container))
        if (equals(x, item)) return true;
      return false;
    default: type_error("argument of type '" + type_name(container) + "' is not iterable");
  }
}

}  // namespace ktune::jinja
