// jinja2's tests (jinja2/tests.py): `x is defined`, `x is divisibleby 3`, `x is not none`, ...
#include <string_view>

#include "text/jinja/bound_args.h"
#include "text/jinja/builtins.h"
#include "text/jinja/operators.h"
#include "text/jinja/python_str.h"
#include "text/jinja/renderer.h"
#include "text/jinja/template_error.h"

namespace ktune::jinja {

namespace {

const char* const kTests[] = {"defined", "undefined", "none",    "boolean", "true",    "false",    "integer",
                              "float",   "number",    "string",  "mapping", "iterable", "sequence", "callable",
                              "sameas",  "escaped",   "even",    "odd",     "divisibleby", "lower", "upper",
                              "in",      "eq",        "equalto", "==",      "ne",      "!=",       "lt",
                              "lessthan", "<",        "le",      "<=",      "gt",      "greaterthan", ">",
                              "ge",      ">=",        "filter",  "test"};

}  // namespace

bool has_test(std::string_view name) {
  for (const char* t : kTests)
    if (name == t) return true;
  return false;
}

bool apply_test(Renderer& r, std::string_view name, const Value& v, const CallArgs& call) {
  (void)r;
  const std::string fname = "test " + std::string(name);
  auto one_arg = [&]() -> const Value& { return BoundArgs(call, fname, {"other"}, 1).get(0); };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict();
  if (name == "callable") return v.is_callable();
  if (name == "escaped") return v.is_markup();
  if (name == "iterable") {
    if (v.is_undefined()) {
      if (v.strict_undefined()) v.fail_undefined();
      return true;
    }
    return v.is_string() || v.is_list() || v.is_dict();
  }
  if (name == "sequence") {
    if (v.is_undefined()) return !v.strict_undefined();
    return v.is_string() || v.is_list() || v.is_dict();
  }
  if (name == "sameas") return v.same_as(one_arg());
  if (name == "even" || name == "odd") {
    Value m = binary_op(BinaryOp::kMod, v, Value::integer(2));
    return equals(m, Value::integer(name == "odd" ? 1 : 0));
  }
  if (name == "divisibleby") return equals(binary_op(BinaryOp::kMod, v, BoundArgs(call, fname, {"num"}, 1).get(0)), Value::integer(0));
  if (name == "lower") return py_is(to_str(v), CharClass::kLower);
  if (name == "upper") return py_is(to_str(v), CharClass::kUpper);
  if (name == "in") return contains(BoundArgs(call, fname, {"seq"}, 1).get(0), v);
  if (name == "eq" || name == "equalto" || name == "==") return equals(v, one_arg());
  if (name == "ne" || name == "!=") return !equals(v, one_arg());
  if (name == "lt" || name == "lessthan" || name == "<") return compare(v, one_arg(), "<") < 0;
  if (name == "le" || name == "<=") return compare(v, one_arg(), "<=") <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">") return compare(v, one_arg(), ">") > 0;
  if (name == "ge" || name == ">=") return compare(v, one_arg(), ">=") >= 0;
  if (name == "filter") return v.is_string() && has_filter(v.as_string());
  if (name == "test") return v.is_string() && has_test(v.as_string());
  fail("TemplateRuntimeError: No test named '" + std::string(name) + "'.");
}

}  // namespace ktune::jinja
