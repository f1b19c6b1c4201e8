// The globals of the two environments: jinja2's range, dict and namespace, the raise_exception
// both torchtune and transformers add, and transformers' strftime_now. In the transformers dialect
// range is the sandbox's (at most 100000 items) and namespace refuses underscore-prefixed names.
// Deliberately not here: lipsum, cycler, joiner (chat templates do not use them).
#include <ctime>
#include <string_view>

#include "text/jinja/bound_args.h"
#include "text/jinja/builtins.h"
#include "text/jinja/renderer.h"
#include "text/jinja/template_error.h"

namespace ktune::jinja {

namespace {

constexpr int64_t kSandboxMaxRange = 100000;      // jinja2.sandbox.MAX_RANGE
constexpr int64_t kUnsandboxedMaxRange = 10000000;  // ktune's guard against runaway templates

Value range(Renderer& r, const CallArgs& call) {
  if (!call.keyword.empty()) type_error("range() takes no keyword arguments");
  if (call.positional.empty() || call.positional.size() > 3)
    type_error(std::string("range expected at most 3 arguments, got ") + std::to_string(call.positional.size()));
  int64_t bounds[3] = {0, 0, 1};
  for (size_t i = 0; i < call.positional.size(); ++i) {
    const Value& v = call.positional[i];
    if (v.is_undefined()) v.fail_undefined();
    if (!v.is_number() || v.is_float()) type_error(std::string("'") + type_name(v) + "' object cannot be interpreted as an integer");
  }
  if (call.positional.size() == 1) {
    bounds[1] = call.positional[0].as_int();
  } else {
    bounds[0] = call.positional[0].as_int();
    bounds[1] = call.positional[1].as_int();
    if (call.positional.size() == 3) bounds[2] = call.positional[2].as_int();
  }
  const int64_t start = bounds[0], stop = bounds[1], step = bounds[2];
  if (step == 0) fail("ValueError: range() arg 3 must not be zero");
  __int128 span = step > 0 ? (__int128(stop) - start + step - 1) / step : (__int128(start) - stop - step - 1) / -step;
  if (span < 0) span = 0;
  if (r.sandboxed() && span > kSandboxMaxRange)
    fail("OverflowError: Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
  if (span > kUnsandboxedMaxRange) fail("OverflowError: range() of more than 10000000 items");
  std::vector<Value> items;
  for (int64_t k = 0; k < int64_t(span); ++k) items.push_back(Value::integer(start + k * step));
  return Value::new_list(std::move(items));
}

// dict(*args, **kwargs): a mapping or a sequence of pairs, then the keywords.
Value make_dict(const CallArgs& call) {
  if (call.positional.size() > 1) type_error("dict expected at most 1 argument, got " + std::to_string(call.positional.size()));
  Value d = Value::new_dict();
  if (!call.positional.empty()) {
    const Value& src = call.positional[0];
    if (src.is_dict()) {
      d.dict().items = src.dict().items;
    } else {
      for (const Value& pair : iterate(src)) {
        std::vector<Value> kv = iterate(pair);
        if (kv.size() != 2) fail("ValueError: dictionary update sequence element has length " + std::to_string(kv.size()) + "; 2 is required");
        d.dict().set(kv[0], kv[1]);
      }
    }
  }
  for (const auto& [k, v] : call.keyword) d.dict().set(Value::string(k), v);
  return d;
}

Value namespace_of(Renderer& r, const CallArgs& call) {
  Value attrs = make_dict(call);
  Value ns = Value::new_object("Namespace", true);
  for (const auto& [k, v] : attrs.dict().items) {
    std::string name = to_str(k);
    if (r.sandboxed() && !name.empty() && name[0] == '_')
      fail("SecurityError: Chat templates cannot store underscore-prefixed attributes on a namespace, but got '" + name +
           "'. Please rename the attribute.");
    ns.object().set(name, v);
  }
  return ns;
}

Value raise_exception(Renderer&, const CallArgs& call) {
  std::string message = call.positional.empty() ? std::string() : to_str(call.positional[0]);
  throw EvalFault(message);  // verbatim: the template's own message is the error
}

Value strftime_now(Renderer&, const CallArgs& call) {
  BoundArgs a(call, "strftime_now", {"format"}, 1);
  if (!a.get(0).is_string()) type_error("strftime() argument 1 must be str, not " + type_name(a.get(0)));
  std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  const std::string& format = a.get(0).as_string();
  if (format.empty()) return Value::string("");
  std::vector<char> buf(format.size() * 8 + 256);
  size_t n = std::strftime(buf.data(), buf.size(), format.c_str(), &local);
  return Value::string(std::string(buf.data(), n));
}

}  // namespace

const Value* find_global(Dialect dialect, std::string_view name) {
  static const Value kRange = Value::callable("range", range);
  static const Value kDict = Value::callable("dict", [](Renderer&, const CallArgs& call) { return make_dict(call); });
  static const Value kNamespace = Value::callable("namespace", namespace_of);
  static const Value kRaise = Value::callable("raise_exception", raise_exception);
  static const Value kStrftime = Value::callable("strftime_now", strftime_now);
  if (name == "range") return &kRange;
  if (name == "dict") return &kDict;
  if (name == "namespace") return &kNamespace;
  if (name == "raise_exception") return &kRaise;
  if (name == "strftime_now" && dialect == Dialect::kTransformers) return &kStrftime;
  return nullptr;
}

}  // namespace ktune::jinja
