// jinja2's filters (jinja2/filters.py) with the same argument names, defaults and edge cases, and
// the dialects' two tojson filters. Filters that return generators in jinja2 (map, select, unique,
// reverse, batch) return lists here: templates consume them with join, list or a for loop.
// Deliberately not here: groupby, slice, pprint, striptags, urlize, urlencode, wordwrap, xmlattr,
// filesizeformat (a template using one fails to load with "No filter named ...").
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cmath>
#include <cstdio>
#include <string_view>

#include "text/jinja/bound_args.h"
#include "text/jinja/builtins.h"
#include "text/jinja/json_dumps.h"
#include "text/jinja/operators.h"
#include "text/jinja/python_str.h"
#include "text/jinja/renderer.h"
#include "text/jinja/template_error.h"
#include "text/unicode_text.h"

namespace ktune::jinja {

namespace {

const char* const kFilters[] = {
    "abs",    "attr",     "batch",   "capitalize", "center",    "count",  "d",        "default", "dictsort",
    "e",      "escape",   "first",   "float",      "forceescape", "format", "indent", "int",     "items",
    "join",   "last",     "length",  "list",       "lower",     "map",    "max",      "min",     "reject",
    "rejectattr", "replace", "reverse", "round",   "safe",      "select", "selectattr", "sort",  "string",
    "sum",    "title",    "tojson",  "trim",       "truncate",  "unique", "upper",    "wordcount"};

// jinja2's make_attrgetter: "a.b.0" looks up a, then b, then item 0, each with getitem rules.
Value lookup_path(Renderer& r, Value item, const Value& attribute, const Value* fallback) {
  std::vector<Value> parts;
  if (attribute.is_string()) {
    for (const std::string& p : py_split(attribute.as_string(), std::string("."), -1)) {
      bool digits = !p.empty() && std::all_of(p.begin(), p.end(), [](char c) { return c >= '0' && c <= '9'; });
      parts.push_back(digits ? Value::integer(std::stoll(p)) : Value::string(p));
    }
  } else {
    parts.push_back(attribute);
  }
  for (const Value& part : parts) {
    item = get_item(r, item, part);
    if (fallback && item.is_undefined()) item = *fallback;
  }
  return item;
}

// A sort key: the attribute(s) looked up, strings lowercased unless case_sensitive.
Value sort_key(Renderer& r, const Value& item, const Value* attribute, bool case_sensitive) {
  auto fold = [&](Value v) { return (!case_sensitive && v.is_string()) ? Value::string(py_lower(v.as_string())) : v; };
  if (!attribute || attribute->is_none()) return fold(item);
  if (attribute->is_string() && attribute->as_string().find(',') != std::string::npos) {
    std::vector<Value> keys;
    for (const std::string& a : py_split(attribute->as_string(), std::string(","), -1))
      keys.push_back(fold(lookup_path(r, item, Value::string(py_strip(a, std::nullopt, true, true)), nullptr)));
    return Value::new_list(std::move(keys));
  }
  return fold(lookup_path(r, item, *attribute, nullptr));
}

std::vector<Value> sorted(std::vector<Value> items, const std::vector<Value>& keys, bool reverse) {
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return reverse ? compare(keys[b], keys[a], "<") < 0 : compare(keys[a], keys[b], "<") < 0;
  });
  std::vector<Value> out;
  for (size_t i : order) out.push_back(items[i]);
  return out;
}

Value markup_of(const Value& v) {
  if (v.is_markup()) return v;
  return Value::markup(html_escape(to_str(v)));
}

// jinja2's indent filter (3.x): the first line and blank lines unindented unless asked.
std::string indent(const std::string& s, const std::string& indention, bool first, bool blank) {
  std::vector<std::string> lines = py_splitlines(s + "\n", false);
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i) rv += '\n' + indention;
      rv += lines[i];
    }
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) {
      rv += '\n';
      if (!lines[i].empty()) rv += indention + lines[i];
    }
  }
  return first ? indention + rv : rv;
}

// jinja2's title filter: each run after - whitespace ( { [ < starts upper, the rest is lower.
std::string title(const std::string& s) {
  std::vector<std::string> cps = code_points(s);
  auto is_sep = [](const std::string& c) {
    char32_t cp;
    text::utf8_decode(c, 0, &cp);
    return cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || is_python_space(cp);
  };
  std::string out;
  bool at_start = true;  // the first character of a run (separator runs included)
  bool prev_sep = false;
  for (size_t i = 0; i < cps.size(); ++i) {
    bool sep = is_sep(cps[i]);
    if (i > 0 && sep != prev_sep) at_start = true;
    out += at_start ? py_upper(cps[i]) : py_lower(cps[i]);
    at_start = false;
    prev_sep = sep;
  }
  return out;
}

Value round_value(const Value& v, int64_t precision, const std::string& method) {
  if (method != "common" && method != "ceil" && method != "floor")
    fail("FilterArgumentError: method must be common, ceil or floor");
  if (v.is_undefined()) v.fail_undefined();
  if (!v.is_number()) type_error("type " + type_name(v) + " doesn't define __round__ method");
  if (method == "common") {
    if (!v.is_float()) return Value::integer(v.as_int());  // round(int, n) is the int for n >= 0
    double x = v.as_float();
    if (!std::isfinite(x)) return v;
    if (precision >= 0 && precision < 300) {
      char buf[512];
      std::snprintf(buf, sizeof buf, "%.*f", int(precision), x);  // correctly rounded, ties to even
      return Value::number(std::strtod(buf, nullptr));
    }
    double scale = std::pow(10.0, double(-precision));
    return Value::number(std::nearbyint(x / scale) * scale);
  }
  double scale = std::pow(10.0, double(precision));
  double x = v.as_float() * scale;
  return Value::number((method == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
}

Value tojson(Renderer& r, const Value& v, const CallArgs& call) {
  JsonDumpOptions o;
  auto indent_of = [](const Value& i) -> std::optional<std::string> {
    if (i.is_none()) return std::nullopt;
    if (i.is_string()) return i.as_string();
    if (i.is_number() && !i.is_float()) return std::string(size_t(std::max<int64_t>(0, i.as_int())), ' ');
    type_error("indent must be an int or a string, not " + type_name(i));
  };
  if (r.options().dialect == Dialect::kJinja2) {
    BoundArgs a(call, "tojson", {"indent"});
    o.sort_keys = true;
    o.ensure_ascii = true;
    if (a.has(0)) o.indent = indent_of(a.get(0));
    return Value::markup(html_safe_json(json_dumps(v, o)));
  }
  BoundArgs a(call, "tojson", {"ensure_ascii", "indent", "separators", "sort_keys"});
  o.ensure_ascii = a.bool_or(0, false);
  if (a.has(1)) o.indent = indent_of(a.get(1));
  if (a.has(2) && !a.get(2).is_none()) {
    std::vector<Value> seps = iterate(a.get(2));
    if (seps.size() != 2 || !seps[0].is_string() || !seps[1].is_string())
      fail("ValueError: separators must be a pair of strings");
    o.item_separator = seps[0].as_string();
    o.key_separator = seps[1].as_string();
  }
  o.sort_keys = a.bool_or(3, false);
  return Value::string(json_dumps(v, o));
}

// select / reject / selectattr / rejectattr
Value select(Renderer& r, const Value& v, const CallArgs& call, bool keep, bool by_attribute, const std::string& fname) {
  size_t off = 0;
  Value attribute;
  if (by_attribute) {
    if (call.positional.empty()) fail("FilterArgumentError: Missing parameter for attribute name");
    attribute = call.positional[0];
    off = 1;
  }
  std::string test;
  CallArgs test_args;
  bool has_test_name = call.positional.size() > off;
  if (has_test_name) {
    test = to_str(call.positional[off]);
    if (!has_test(test)) fail("TemplateRuntimeError: No test named '" + test + "'.");
    test_args.positional.assign(call.positional.begin() + long(off) + 1, call.positional.end());
    test_args.keyword = call.keyword;
  } else if (!call.keyword.empty()) {
    type_error(fname + "() got an unexpected keyword argument '" + call.keyword[0].first + "'");
  }
  std::vector<Value> out;
  for (const Value& item : iterate(v)) {
    Value subject = by_attribute ? lookup_path(r, item, attribute, nullptr) : item;
    bool passes = has_test_name ? apply_test(r, test, subject, test_args) : truthy(subject);
    if (passes == keep) out.push_back(item);
  }
  return Value::new_list(std::move(out));
}

Value map_filter(Renderer& r, const Value& v, const CallArgs& call) {
  std::vector<Value> out;
  if (call.positional.empty()) {
    const Value* attribute = nullptr;
    const Value* fallback = nullptr;
    for (const auto& [k, value] : call.keyword) {
      if (k == "attribute") attribute = &value;
      else if (k == "default") fallback = &value;
      else fail("FilterArgumentError: Unexpected keyword argument '" + k + "'");
    }
    if (!attribute) fail("FilterArgumentError: map requires a filter argument");
    for (const Value& item : iterate(v)) out.push_back(lookup_path(r, item, *attribute, fallback && !fallback->is_none() ? fallback : nullptr));
    return Value::new_list(std::move(out));
  }
  std::string filter = to_str(call.positional[0]);
  if (!has_filter(filter)) fail("TemplateRuntimeError: No filter named '" + filter + "'.");
  CallArgs rest;
  rest.positional.assign(call.positional.begin() + 1, call.positional.end());
  rest.keyword = call.keyword;
  for (const Value& item : iterate(v)) out.push_back(apply_filter(r, filter, item, rest));
  return Value::new_list(std::move(out));
}

Value min_max(Renderer& r, const Value& v, const CallArgs& call, bool want_max, const char* fname) {
  BoundArgs a(call, fname, {"case_sensitive", "attribute"});
  bool case_sensitive = a.bool_or(0, false);
  const Value* attribute = a.has(1) ? &a.get(1) : nullptr;
  std::vector<Value> items = iterate(v);
  if (items.empty()) return r.undefined("No aggregated item, sequence was empty.");
  size_t best = 0;
  Value best_key = sort_key(r, items[0], attribute, case_sensitive);
  for (size_t i = 1; i < items.size(); ++i) {
    Value k = sort_key(r, items[i], attribute, case_sensitive);
    int c = compare(k, best_key, want_max ? ">" : "<");
    if (want_max ? c > 0 : c < 0) {
      best = i;
      best_key = k;
    }
  }
  return items[best];
}

}  // namespace

bool has_filter(std::string_view name) {
  for (const char* f : kFilters)
    if (name == f) return true;
  return false;
}

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

Value apply_filter(Renderer& r, std::string_view name, const Value& v, const CallArgs& call) {
  const std::string fname(name);
  auto args = [&](std::initializer_list<const char*> params, size_t required = 0) {
    return BoundArgs(call, fname, params, required);
  };
  if (name == "default" || name == "d") {
    BoundArgs a = args({"default_value", "boolean"});
    bool use_default = v.is_undefined() || (a.bool_or(1, false) && !truthy(v));
    return use_default ? a.get_or(0, Value::string("")) : v;
  }
  if (name == "length" || name == "count") return args({}), Value::integer(length(v));
  if (name == "string") return args({}), v.is_markup() ? v : Value::string(to_str(v));
  // soft_str keeps a Markup, and Markup's upper/lower/capitalize/strip/center return Markup.
  auto same_kind = [&](std::string s) { return v.is_markup() ? Value::markup(std::move(s)) : Value::string(std::move(s)); };
  if (name == "upper") return args({}), same_kind(py_upper(to_str(v)));
  if (name == "lower") return args({}), same_kind(py_lower(to_str(v)));
  if (name == "capitalize") return args({}), same_kind(py_capitalize(to_str(v)));
  if (name == "title") return args({}), Value::string(title(to_str(v)));
  if (name == "trim") {
    BoundArgs a = args({"chars"});
    std::optional<std::string> chars = a.string_or_none(0);
    if (chars && v.is_markup() && !a.get(0).is_markup()) chars = html_escape(*chars);
    return same_kind(py_strip(to_str(v), chars, true, true));
  }
  if (name == "replace") {
    BoundArgs a = args({"old", "new", "count"}, 2);
    return Value::string(py_replace(to_str(v), to_str(a.get(0)), to_str(a.get(1)), a.int_or(2, -1)));
  }
  if (name == "tojson") return tojson(r, v, call);
  if (name == "safe") return args({}), v.is_markup() ? v : Value::markup(to_str(v));
  if (name == "e" || name == "escape" || name == "forceescape") {
    args({});
    if (name == "forceescape") return Value::markup(html_escape(to_str(v)));
    return markup_of(v);
  }
  if (name == "join") {
    BoundArgs a = args({"d", "attribute"});
    std::string sep = a.has(0) ? to_str(a.get(0)) : "";
    std::string out;
    bool first = true;
    for (const Value& item : iterate(v)) {
      if (!first) out += sep;
      first = false;
      out += to_str(a.has(1) && !a.get(1).is_none() ? lookup_path(r, item, a.get(1), nullptr) : item);
    }
    return Value::string(out);
  }
  if (name == "first" || name == "last") {
    args({});
    std::vector<Value> items = iterate(v);
    if (items.empty()) return r.undefined(name == "first" ? "No first item, sequence was empty." : "No last item, sequence was empty.");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") return args({}), Value::new_list(iterate(v));
  if (name == "items") {
    args({});
    if (v.is_undefined()) {
      if (v.strict_undefined()) v.fail_undefined();
      return Value::new_list();
    }
    if (!v.is_dict()) type_error("Can only get item pairs from a mapping.");
    std::vector<Value> out;
    for (const auto& [k, item] : v.dict().items) out.push_back(Value::new_tuple({k, item}));
    return Value::new_list(std::move(out));
  }
  if (name == "dictsort") {
    BoundArgs a = args({"case_sensitive", "by", "reverse"});
    bool case_sensitive = a.bool_or(0, false);
    std::string by = a.has(1) ? to_str(a.get(1)) : "key";
    if (by != "key" && by != "value") fail("FilterArgumentError: You can only sort by either \"key\" or \"value\"");
    if (!v.is_dict()) type_error("'" + type_name(v) + "' object has no attribute 'items'");
    std::vector<Value> items, keys;
    for (const auto& [k, item] : v.dict().items) {
      items.push_back(Value::new_tuple({k, item}));
      Value key = by == "key" ? k : item;
      keys.push_back(!case_sensitive && key.is_string() ? Value::string(py_lower(key.as_string())) : key);
    }
    return Value::new_list(sorted(items, keys, a.bool_or(2, false)));
  }
  if (name == "sort") {
    BoundArgs a = args({"reverse", "case_sensitive", "attribute"});
    std::vector<Value> items = iterate(v), keys;
    const Value* attribute = a.has(2) ? &a.get(2) : nullptr;
    for (const Value& item : items) keys.push_back(sort_key(r, item, attribute, a.bool_or(1, false)));
    return Value::new_list(sorted(items, keys, a.bool_or(0, false)));
  }
  if (name == "unique") {
    BoundArgs a = args({"case_sensitive", "attribute"});
    const Value* attribute = a.has(1) ? &a.get(1) : nullptr;
    std::vector<Value> out, seen;
    for (const Value& item : iterate(v)) {
      Value key = sort_key(r, item, attribute, a.bool_or(0, false));
      if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, key); })) continue;
      seen.push_back(key);
      out.push_back(item);
    }
    return Value::new_list(std::move(out));
  }
  if (name == "reverse") {
    args({});
    if (v.is_string()) {
      std::vector<std::string> cps = code_points(v.as_string());
      std::string out;
      for (auto it = cps.rbegin(); it != cps.rend(); ++it) out += *it;
      return Value::string(out);
    }
    std::vector<Value> items = iterate(v);
    std::reverse(items.begin(), items.end());
    return Value::new_list(std::move(items));
  }
  if (name == "map") return map_filter(r, v, call);
  if (name == "select") return select(r, v, call, true, false, fname);
  if (name == "reject") return select(r, v, call, false, false, fname);
  if (name == "selectattr") return select(r, v, call, true, true, fname);
  if (name == "rejectattr") return select(r, v, call, false, true, fname);
  if (name == "attr") {
    BoundArgs a = args({"name"}, 1);
    std::string attr = to_str(a.get(0));
    if (v.is_dict()) {  // a real attribute only: a dict's keys are not its attributes
      Value method = get_attribute(r, v, attr);
      if (method.is_callable() || method.is_undefined()) return method;
      return r.undefined("'dict object' has no attribute " + repr(Value::string(attr)));
    }
    if (v.is_undefined()) v.fail_undefined();
    return get_attribute(r, v, attr);
  }
  if (name == "int") {
    BoundArgs a = args({"default", "base"});
    Value fallback = a.get_or(0, Value::integer(0));
    int64_t base = a.int_or(1, 10);
    if (v.is_number()) return v.is_float() ? (std::isfinite(v.as_float()) ? Value::integer(int64_t(std::trunc(v.as_float()))) : fallback) : Value::integer(v.as_int());
    if (!v.is_string()) return fallback;
    std::string s = py_strip(v.as_string(), std::nullopt, true, true);
    std::string digits;
    for (char c : s)
      if (c != '_') digits += c;
    if (!digits.empty()) {
      char* end = nullptr;
      errno = 0;
      long long n = std::strtoll(digits.c_str(), &end, int(base));
      if (end && *end == '\0' && errno == 0) return Value::integer(n);
      errno = 0;
      double d = std::strtod(digits.c_str(), &end);
      if (end && *end == '\0' && std::isfinite(d)) return Value::integer(int64_t(std::trunc(d)));
    }
    return fallback;
  }
  if (name == "float") {
    BoundArgs a = args({"default"});
    Value fallback = a.get_or(0, Value::number(0.0));
    if (v.is_number()) return Value::number(v.as_float());
    if (!v.is_string()) return fallback;
    std::string s = py_strip(v.as_string(), std::nullopt, true, true);
    char* end = nullptr;
    double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && end && *end == '\0') return Value::number(d);
    return fallback;
  }
  if (name == "abs") {
    args({});
    if (v.is_float()) return Value::number(std::fabs(v.as_float()));
    if (v.is_number()) return v.as_int() < 0 ? negate(v) : Value::integer(v.as_int());
    if (v.is_undefined()) v.fail_undefined();
    type_error("bad operand type for abs(): '" + type_name(v) + "'");
  }
  if (name == "round") {
    BoundArgs a = args({"precision", "method"});
    return round_value(v, a.int_or(0, 0), a.has(1) ? to_str(a.get(1)) : "common");
  }
  if (name == "sum") {
    BoundArgs a = args({"attribute", "start"});
    Value total = a.get_or(1, Value::integer(0));
    for (const Value& item : iterate(v))
      total = binary_op(BinaryOp::kAdd, total, a.has(0) && !a.get(0).is_none() ? lookup_path(r, item, a.get(0), nullptr) : item);
    return total;
  }
  if (name == "min") return min_max(r, v, call, false, "min");
  if (name == "max") return min_max(r, v, call, true, "max");
  if (name == "batch") {
    BoundArgs a = args({"linecount", "fill_with"}, 1);
    int64_t n = a.int_or(0, 1);
    if (n <= 0) fail("ValueError: batch size must be positive");
    std::vector<Value> out, current;
    for (const Value& item : iterate(v)) {
      current.push_back(item);
      if (int64_t(current.size()) == n) {
        out.push_back(Value::new_list(std::move(current)));
        current.clear();
      }
    }
    if (!current.empty()) {
      if (a.has(1) && !a.get(1).is_none())
        while (int64_t(current.size()) < n) current.push_back(a.get(1));
      out.push_back(Value::new_list(std::move(current)));
    }
    return Value::new_list(std::move(out));
  }
  if (name == "wordcount") {
    args({});
    int64_t words = 0;
    bool in_word = false;
    for (const std::string& cp : code_points(to_str(v))) {
      bool word_char = cp == "_" || py_is(cp, CharClass::kAlnum);
      if (word_char && !in_word) ++words;
      in_word = word_char;
    }
    return Value::integer(words);
  }
  if (name == "center") {
    BoundArgs a = args({"width"});
    std::string s = to_str(v);
    int64_t width = a.int_or(0, 80), n = code_point_count(s);
    if (width <= n) return same_kind(s);
    int64_t total = width - n, left = total / 2 + (total & width & 1);
    return same_kind(std::string(size_t(left), ' ') + s + std::string(size_t(total - left), ' '));
  }
  if (name == "indent") {
    BoundArgs a = args({"width", "first", "blank"});
    std::string indention = "    ";
    if (a.has(0)) indention = a.get(0).is_string() ? a.get(0).as_string() : std::string(size_t(std::max<int64_t>(0, a.int_or(0, 4))), ' ');
    return same_kind(indent(to_str(v), indention, a.bool_or(1, false), a.bool_or(2, false)));
  }
  if (name == "truncate") {
    BoundArgs a = args({"length", "killwords", "end", "leeway"});
    std::string s = to_str(v);
    int64_t len = a.int_or(0, 255), leeway = a.int_or(3, 5);
    std::string end = a.has(2) ? to_str(a.get(2)) : "...";
    int64_t end_len = code_point_count(end);
    if (len < end_len) fail("AssertionError: expected length >= " + std::to_string(end_len) + ", got " + std::to_string(len));
    std::vector<std::string> cps = code_points(s);
    if (int64_t(cps.size()) <= len + leeway) return Value::string(s);
    std::string head;
    for (int64_t i = 0; i < len - end_len; ++i) head += cps[size_t(i)];
    if (a.bool_or(1, false)) return Value::string(head + end);
    return Value::string(py_rsplit(head, std::string(" "), 1)[0] + end);
  }
  if (name == "format") {
    if (!call.positional.empty() && !call.keyword.empty())
      fail("FilterArgumentError: can't handle positional and keyword arguments at the same time");
    Value format_args;
    if (!call.keyword.empty()) {
      format_args = Value::new_dict();
      for (const auto& [k, value] : call.keyword) format_args.dict().set(Value::string(k), value);
    } else {
      format_args = Value::new_tuple(call.positional);
    }
    return Value::string(percent_format(to_str(v), format_args));
  }
  fail("TemplateRuntimeError: No filter named '" + fname + "'.");
}

}  // namespace ktune::jinja
