// Attribute and item lookup with jinja2's rules, slicing, and the methods of str, list and dict
// that templates call. In the transformers dialect the sandbox refuses the methods that mutate a
// list or dict (jinja2.sandbox's _mutable_spec): they come back as an Undefined that raises
// SecurityError when called.
#include <algorithm>

#include "text/jinja/bound_args.h"
#include "text/jinja/builtins.h"
#include "text/jinja/python_str.h"
#include "text/jinja/renderer.h"
#include "text/jinja/template_error.h"

namespace ktune::jinja {

namespace {

std::string py_quoted(const std::string& name) { return repr(Value::string(name)); }

Value missing_attribute(Renderer& r, const Value& object, const std::string& name) {
  return r.undefined("'" + object_type_repr(object) + "' has no attribute " + py_quoted(name));
}

Value missing_element(Renderer& r, const Value& object, const Value& key) {
  if (key.is_string()) return missing_attribute(r, object, key.as_string());
  return r.undefined(object_type_repr(object) + " has no element " + repr(key));
}

const std::string& str_arg(const Value& v, const char* method) {
  if (v.is_undefined()) v.fail_undefined();
  if (!v.is_string()) type_error(std::string(method) + "() argument must be str, not " + type_name(v));
  return v.as_string();
}

// Normalises a Python index against a length; false when out of range.
bool normalize_index(int64_t& i, int64_t n) {
  if (i < 0) i += n;
  return i >= 0 && i < n;
}

// --- str methods
bool starts_or_ends(const std::string& s, const Value& affix, bool at_start, const char* method) {
  if (affix.is_tuple()) {
    for (const Value& a : affix.list().items)
      if (starts_or_ends(s, a, at_start, method)) return true;
    return false;
  }
  if (!affix.is_string())
    type_error(std::string(method) + " first arg must be str or a tuple of str, not " + type_name(affix));
  const std::string& a = affix.as_string();
  if (a.size() > s.size()) return false;
  return at_start ? s.compare(0, a.size(), a) == 0 : s.compare(s.size() - a.size(), a.size(), a) == 0;
}

Value string_list(const std::vector<std::string>& parts) {
  std::vector<Value> items;
  for (const std::string& p : parts) items.push_back(Value::string(p));
  return Value::new_list(std::move(items));
}

std::string pad(const std::string& s, int64_t width, const std::string& fill, int where /* -1 left, 0 center, 1 right */) {
  int64_t n = code_point_count(s);
  if (width <= n) return s;
  int64_t total = width - n;
  int64_t left = where < 0 ? 0 : where > 0 ? total : total / 2 + (total & width & 1);
  int64_t right = total - left;
  std::string out;
  for (int64_t i = 0; i < left; ++i) out += fill;
  out += s;
  for (int64_t i = 0; i < right; ++i) out += fill;
  return out;
}

// str.format with {} {0} {name} fields, {{ }} escapes, and !s / !r conversions.
std::string str_format(const std::string& format, const CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < format.size(); ++i) {
    char c = format[i];
    if (c == '}' ) {
      if (i + 1 < format.size() && format[i + 1] == '}') ++i;
      out += '}';
      continue;
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < format.size() && format[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    size_t close = format.find('}', i);
    if (close == std::string::npos) fail("ValueError: Single '{' encountered in format string");
    std::string field = format.substr(i + 1, close - i - 1);
    i = close;
    char conversion = 's';
    size_t bang = field.find('!');
    if (bang != std::string::npos) {
      conversion = bang + 1 < field.size() ? field[bang + 1] : 's';
      field = field.substr(0, bang);
    }
    if (field.find(':') != std::string::npos) fail("ValueError: format specs in str.format are not supported by ktune's Jinja engine");
    const Value* v = nullptr;
    if (field.empty()) {
      if (auto_index >= args.positional.size()) fail("IndexError: Replacement index " + std::to_string(auto_index) + " out of range for positional args tuple");
      v = &args.positional[auto_index++];
    } else if (std::all_of(field.begin(), field.end(), [](char d) { return d >= '0' && d <= '9'; })) {
      size_t k = std::stoul(field);
      if (k >= args.positional.size()) fail("IndexError: Replacement index " + field + " out of range for positional args tuple");
      v = &args.positional[k];
    } else {
      for (const auto& [key, value] : args.keyword)
        if (key == field) v = &value;
      if (!v) fail("KeyError: " + py_quoted(field));
    }
    out += conversion == 'r' ? repr(*v) : to_str(*v);
  }
  return out;
}

Value string_method(const std::string& s, const std::string& name, const CallArgs& call) {
  auto args = [&](std::initializer_list<const char*> params, size_t required = 0) {
    return BoundArgs(call, "str." + name, params, required);
  };
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    BoundArgs a = args({"chars"});
    return Value::string(py_strip(s, a.string_or_none(0), name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    BoundArgs a = args({"sep", "maxsplit"});
    auto parts = name == "split" ? py_split(s, a.string_or_none(0), a.int_or(1, -1))
                                 : py_rsplit(s, a.string_or_none(0), a.int_or(1, -1));
    return string_list(parts);
  }
  if (name == "splitlines") return string_list(py_splitlines(s, args({"keepends"}).bool_or(0, false)));
  if (name == "startswith" || name == "endswith") {
    BoundArgs a = args({"prefix"}, 1);
    return Value::boolean(starts_or_ends(s, a.get(0), name == "startswith", name.c_str()));
  }
  if (name == "upper") return args({}), Value::string(py_upper(s));
  if (name == "lower" || name == "casefold") return args({}), Value::string(py_lower(s));
  if (name == "title") return args({}), Value::string(py_title(s));
  if (name == "capitalize") return args({}), Value::string(py_capitalize(s));
  if (name == "swapcase") return args({}), Value::string(py_swapcase(s));
  if (name == "replace") {
    BoundArgs a = args({"old", "new", "count"}, 2);
    return Value::string(py_replace(s, str_arg(a.get(0), "replace"), str_arg(a.get(1), "replace"), a.int_or(2, -1)));
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
    BoundArgs a = args({"sub"}, 1);
    int64_t at = py_find(s, str_arg(a.get(0), name.c_str()), name[0] == 'r');
    if (at < 0 && name.find("index") != std::string::npos) fail("ValueError: substring not found");
    return Value::integer(at);
  }
  if (name == "count") return Value::integer(py_count(s, str_arg(args({"sub"}, 1).get(0), "count")));
  if (name == "join") {
    BoundArgs a = args({"iterable"}, 1);
    std::string out;
    bool first = true;
    for (const Value& item : iterate(a.get(0))) {
      if (!item.is_string()) type_error("sequence item: expected str instance, " + type_name(item) + " found");
      if (!first) out += s;
      out += item.as_string();
      first = false;
    }
    return Value::string(out);
  }
  if (name == "format") return Value::string(str_format(s, call));
  if (name == "center" || name == "ljust" || name == "rjust") {
    BoundArgs a = args({"width", "fillchar"}, 1);
    std::string fill = a.string_or_none(1).value_or(" ");
    return Value::string(pad(s, a.int_or(0, 0), fill, name == "center" ? 0 : name == "ljust" ? -1 : 1));
  }
  if (name == "zfill") {
    int64_t width = args({"width"}, 1).int_or(0, 0);
    bool sign = !s.empty() && (s[0] == '-' || s[0] == '+');
    std::string body = sign ? s.substr(1) : s;
    std::string zeros(size_t(std::max<int64_t>(0, width - code_point_count(s))), '0');
    return Value::string((sign ? s.substr(0, 1) : "") + zeros + body);
  }
  if (name == "removeprefix" || name == "removesuffix") {
    const std::string& affix = str_arg(args({"affix"}, 1).get(0), name.c_str());
    bool prefix = name == "removeprefix";
    if (starts_or_ends(s, Value::string(affix), prefix, name.c_str()))
      return Value::string(prefix ? s.substr(affix.size()) : s.substr(0, s.size() - affix.size()));
    return Value::string(s);
  }
  if (name == "partition" || name == "rpartition") {
    const std::string& sep = str_arg(args({"sep"}, 1).get(0), name.c_str());
    if (sep.empty()) fail("ValueError: empty separator");
    size_t at = name == "partition" ? s.find(sep) : s.rfind(sep);
    if (at == std::string::npos)
      return name == "partition" ? Value::new_tuple({Value::string(s), Value::string(""), Value::string("")})
                                 : Value::new_tuple({Value::string(""), Value::string(""), Value::string(s)});
    return Value::new_tuple({Value::string(s.substr(0, at)), Value::string(sep), Value::string(s.substr(at + sep.size()))});
  }
  static const std::pair<const char*, CharClass> kClasses[] = {
      {"isalpha", CharClass::kAlpha},     {"isdigit", CharClass::kDigit},     {"isalnum", CharClass::kAlnum},
      {"isspace", CharClass::kSpace},     {"islower", CharClass::kLower},     {"isupper", CharClass::kUpper},
      {"isdecimal", CharClass::kDecimal}, {"isnumeric", CharClass::kNumeric}};
  for (const auto& [method, cls] : kClasses)
    if (name == method) return args({}), Value::boolean(py_is(s, cls));
  fail("AttributeError: 'str' object has no attribute " + py_quoted(name));
}

bool is_string_method(const std::string& name) {
  static const char* const kNames[] = {
      "strip",   "lstrip",  "rstrip",    "split",      "rsplit",       "splitlines",   "startswith", "endswith",
      "upper",   "lower",   "casefold",  "title",      "capitalize",   "swapcase",     "replace",    "find",
      "rfind",   "index",   "rindex",    "count",      "join",         "format",       "center",     "ljust",
      "rjust",   "zfill",   "removeprefix", "removesuffix", "partition", "rpartition", "isalpha",   "isdigit",
      "isalnum", "isspace", "islower",   "isupper",    "isdecimal",    "isnumeric"};
  for (const char* n : kNames)
    if (name == n) return true;
  return false;
}

// --- list methods
const char* const kListMutators[] = {"append", "clear", "extend", "insert", "pop", "remove", "reverse", "sort"};
const char* const kDictMutators[] = {"clear", "pop", "popitem", "setdefault", "update"};

template <size_t N>
bool in_list(const std::string& name, const char* const (&names)[N]) {
  for (const char* n : names)
    if (name == n) return true;
  return false;
}

Value list_method(const Value& self, const std::string& name, const CallArgs& call) {
  std::vector<Value>& items = self.list().items;
  auto args = [&](std::initializer_list<const char*> params, size_t required = 0) {
    return BoundArgs(call, "list." + name, params, required);
  };
  if (self.is_tuple() && in_list(name, kListMutators)) fail("AttributeError: 'tuple' object has no attribute " + py_quoted(name));
  if (name == "append") {
    items.push_back(args({"object"}, 1).get(0));
    return Value::none();
  }
  if (name == "extend") {
    for (const Value& v : iterate(args({"iterable"}, 1).get(0))) items.push_back(v);
    return Value::none();
  }
  if (name == "insert") {
    BoundArgs a = args({"index", "object"}, 2);
    int64_t n = int64_t(items.size()), i = a.int_or(0, 0);
    if (i < 0) i = std::max<int64_t>(0, i + n);
    items.insert(items.begin() + std::min(i, n), a.get(1));
    return Value::none();
  }
  if (name == "pop") {
    int64_t i = args({"index"}).int_or(0, -1);
    if (items.empty()) fail("IndexError: pop from empty list");
    if (!normalize_index(i, int64_t(items.size()))) fail("IndexError: pop index out of range");
    Value v = items[size_t(i)];
    items.erase(items.begin() + i);
    return v;
  }
  if (name == "remove") {
    const Value& x = args({"value"}, 1).get(0);
    for (auto it = items.begin(); it != items.end(); ++it)
      if (equals(*it, x)) {
        items.erase(it);
        return Value::none();
      }
    fail("ValueError: list.remove(x): x not in list");
  }
  if (name == "clear") {
    args({});
    items.clear();
    return Value::none();
  }
  if (name == "reverse") {
    args({});
    std::reverse(items.begin(), items.end());
    return Value::none();
  }
  if (name == "sort") {
    bool reverse = args({"key", "reverse"}).bool_or(1, false);
    std::stable_sort(items.begin(), items.end(),
                     [&](const Value& a, const Value& b) { return reverse ? compare(b, a, "<") < 0 : compare(a, b, "<") < 0; });
    return Value::none();
  }
  if (name == "index") {
    const Value& x = args({"value"}, 1).get(0);
    for (size_t i = 0; i < items.size(); ++i)
      if (equals(items[i], x)) return Value::integer(int64_t(i));
    fail("ValueError: " + repr(x) + " is not in list");
  }
  if (name == "count") {
    const Value& x = args({"value"}, 1).get(0);
    return Value::integer(std::count_if(items.begin(), items.end(), [&](const Value& v) { return equals(v, x); }));
  }
  if (name == "copy") return args({}), Value::new_list(items);
  fail("AttributeError: '" + type_name(self) + "' object has no attribute " + py_quoted(name));
}

bool is_list_method(const std::string& name) {
  return in_list(name, kListMutators) || name == "index" || name == "count" || name == "copy";
}

// --- dict methods
Value dict_method(Renderer& r, const Value& self, const std::string& name, const CallArgs& call) {
  DictData& d = self.dict();
  auto args = [&](std::initializer_list<const char*> params, size_t required = 0) {
    return BoundArgs(call, "dict." + name, params, required);
  };
  if (name == "items") {
    args({});
    std::vector<Value> out;
    for (const auto& [k, v] : d.items) out.push_back(Value::new_tuple({k, v}));
    return Value::new_list(std::move(out));
  }
  if (name == "keys" || name == "values") {
    args({});
    std::vector<Value> out;
    for (const auto& [k, v] : d.items) out.push_back(name == "keys" ? k : v);
    return Value::new_list(std::move(out));
  }
  if (name == "get") {
    BoundArgs a = args({"key", "default"}, 1);
    const Value* v = d.find(a.get(0));
    return v ? *v : a.get_or(1, Value::none());
  }
  if (name == "copy") {
    args({});
    Value copy = Value::new_dict();
    copy.dict().items = d.items;
    return copy;
  }
  if (name == "pop") {
    BoundArgs a = args({"key", "default"}, 1);
    const Value* v = d.find(a.get(0));
    if (!v) {
      if (a.has(1)) return a.get(1);
      fail("KeyError: " + repr(a.get(0)));
    }
    Value out = *v;
    d.erase(a.get(0));
    return out;
  }
  if (name == "setdefault") {
    BoundArgs a = args({"key", "default"}, 1);
    if (const Value* v = d.find(a.get(0))) return *v;
    d.set(a.get(0), a.get_or(1, Value::none()));
    return a.get_or(1, Value::none());
  }
  if (name == "update") {
    if (call.positional.size() > 1) type_error("update expected at most 1 argument");
    if (!call.positional.empty()) {
      const Value& other = call.positional[0];
      if (other.is_dict()) {
        for (const auto& [k, v] : other.dict().items) d.set(k, v);
      } else {
        for (const Value& pair : iterate(other)) {
          std::vector<Value> kv = iterate(pair);
          if (kv.size() != 2) fail("ValueError: dictionary update sequence element has length " + std::to_string(kv.size()) + "; 2 is required");
          d.set(kv[0], kv[1]);
        }
      }
    }
    for (const auto& [k, v] : call.keyword) d.set(Value::string(k), v);
    return Value::none();
  }
  if (name == "clear") {
    args({});
    d.items.clear();
    return Value::none();
  }
  if (name == "popitem") {
    args({});
    if (d.items.empty()) fail("KeyError: 'popitem(): dictionary is empty'");
    Value out = Value::new_tuple({d.items.back().first, d.items.back().second});
    d.items.pop_back();
    return out;
  }
  (void)r;
  fail("AttributeError: 'dict' object has no attribute " + py_quoted(name));
}

bool is_dict_method(const std::string& name) {
  return in_list(name, kDictMutators) || name == "items" || name == "keys" || name == "values" || name == "get" ||
         name == "copy";
}

// The str methods markupsafe's Markup wraps: their string arguments are escaped and the result is
// Markup again.
bool markup_keeps(const std::string& name) {
  static const char* const kNames[] = {"capitalize", "title", "lower", "upper", "replace", "ljust", "rjust",
                                       "lstrip", "rstrip", "center", "strip", "swapcase", "zfill"};
  for (const char* n : kNames)
    if (name == n) return true;
  return false;
}

Value markup_method(const std::string& s, const std::string& name, const CallArgs& args) {
  CallArgs escaped = args;
  for (Value& v : escaped.positional)
    if (v.is_string() && !v.is_markup()) v = Value::markup(html_escape(v.as_string()));
  for (auto& kv : escaped.keyword)
    if (kv.second.is_string() && !kv.second.is_markup()) kv.second = Value::markup(html_escape(kv.second.as_string()));
  Value out = string_method(s, name, escaped);
  return Value::markup(out.as_string());
}

Value bound_method(const Value& self, const std::string& name) {
  return Value::callable(type_name(self) + "." + name, [self, name](Renderer& r, const CallArgs& args) {
    if (self.is_string() && self.is_markup() && markup_keeps(name)) return markup_method(self.as_string(), name, args);
    if (self.is_string()) return string_method(self.as_string(), name, args);
    if (self.is_list()) return list_method(self, name, args);
    return dict_method(r, self, name, args);
  });
}

Value unsafe(Renderer& r, const Value& self, const std::string& name) {
  return Value::undefined("access to attribute " + py_quoted(name) + " of " + py_quoted(type_name(self)) + " object is unsafe.",
                          r.options().strict_undefined, true);
}

}  // namespace

Value get_attribute(Renderer& r, const Value& object, const std::string& name) {
  switch (object.kind()) {
    case Value::Kind::kUndefined: object.fail_undefined();
    case Value::Kind::kString:
      if (is_string_method(name)) return bound_method(object, name);
      break;
    case Value::Kind::kList:
      if (is_list_method(name) && !(object.is_tuple() && in_list(name, kListMutators))) {
        if (r.sandboxed() && in_list(name, kListMutators)) return unsafe(r, object, name);
        return bound_method(object, name);
      }
      break;
    case Value::Kind::kDict:
      if (is_dict_method(name)) {
        if (r.sandboxed() && in_list(name, kDictMutators)) return unsafe(r, object, name);
        return bound_method(object, name);
      }
      if (const Value* v = object.dict().find(Value::string(name))) return *v;
      break;
    case Value::Kind::kObject:
      if (const Value* v = object.object().find(name)) return *v;
      break;
    default: break;
  }
  return missing_attribute(r, object, name);
}

Value get_item(Renderer& r, const Value& object, const Value& key) {
  if (key.is_undefined() && key.strict_undefined()) key.fail_undefined();
  switch (object.kind()) {
    case Value::Kind::kUndefined: object.fail_undefined();
    case Value::Kind::kDict:
      if (const Value* v = object.dict().find(key)) return *v;
      break;
    case Value::Kind::kList:
      if (key.is_number() && !key.is_float()) {
        int64_t i = key.as_int();
        const auto& items = object.list().items;
        if (normalize_index(i, int64_t(items.size()))) return items[size_t(i)];
        return missing_element(r, object, key);
      }
      break;
    case Value::Kind::kString:
      if (key.is_number() && !key.is_float()) {
        std::vector<std::string> cps = code_points(object.as_string());
        int64_t i = key.as_int();
        if (normalize_index(i, int64_t(cps.size())))
          return object.is_markup() ? Value::markup(cps[size_t(i)]) : Value::string(cps[size_t(i)]);
        return missing_element(r, object, key);
      }
      break;
    default: break;
  }
  if (key.is_string()) return get_attribute(r, object, key.as_string());
  return missing_element(r, object, key);
}

Value get_slice(const Value& object, const Value* start, const Value* stop, const Value* step) {
  auto index = [](const Value* v, int64_t fallback) {
    if (!v || v->is_none()) return std::pair<bool, int64_t>(false, fallback);
    if (v->is_undefined()) v->fail_undefined();
    if (!v->is_number() || v->is_float()) type_error("slice indices must be integers or None or have an __index__ method");
    return std::pair<bool, int64_t>(true, v->as_int());
  };
  auto [has_step, st] = index(step, 1);
  (void)has_step;
  if (st == 0) fail("ValueError: slice step cannot be zero");
  std::vector<Value> items;
  std::vector<std::string> cps;
  int64_t n;
  if (object.is_string()) {
    cps = code_points(object.as_string());
    n = int64_t(cps.size());
  } else if (object.is_list()) {
    n = int64_t(object.list().items.size());
  } else {
    type_error("'" + type_name(object) + "' object is not subscriptable");
  }
  int64_t lower = st > 0 ? 0 : -1, upper = st > 0 ? n : n - 1;
  auto clamp = [&](std::pair<bool, int64_t> v, int64_t fallback) {
    if (!v.first) return fallback;
    int64_t i = v.second;
    if (i < 0) i += n;
    return std::clamp(i, lower, upper);
  };
  int64_t b = clamp(index(start, 0), st > 0 ? lower : upper);
  int64_t e = clamp(index(stop, 0), st > 0 ? upper : lower);
  std::string out_string;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) {
    if (object.is_string()) out_string += cps[size_t(i)];
    else items.push_back(object.list().items[size_t(i)]);
  }
  if (object.is_string()) return object.is_markup() ? Value::markup(out_string) : Value::string(out_string);
  return object.is_tuple() ? Value::new_tuple(std::move(items)) : Value::new_list(std::move(items));
}

}  // namespace ktune::jinja
