// Python's binding of call arguments to a builtin's parameters.
#include "text/jinja/bound_args.h"

#include <cstring>

#include "text/jinja/template_error.h"

namespace ktune::jinja {

BoundArgs::BoundArgs(const CallArgs& args, const std::string& function, std::initializer_list<const char*> params,
                     size_t required)
    : function_(function), names_(params), slots_(params.size(), nullptr) {
  if (args.positional.size() > names_.size())
    type_error(function + "() takes at most " + std::to_string(names_.size()) + " argument(s) (" +
               std::to_string(args.positional.size()) + " given)");
  for (size_t i = 0; i < args.positional.size(); ++i) slots_[i] = &args.positional[i];
  for (const auto& [key, value] : args.keyword) {
    size_t i = 0;
    while (i < names_.size() && key != names_[i]) ++i;
    if (i == names_.size()) type_error(function + "() got an unexpected keyword argument '" + key + "'");
    if (slots_[i]) type_error(function + "() got multiple values for argument '" + key + "'");
    slots_[i] = &value;
  }
  for (size_t i = 0; i < required; ++i)
    if (!slots_[i]) type_error(function + "() missing required argument '" + names_[i] + "'");
}

int64_t BoundArgs::int_or(size_t i, int64_t fallback) const {
  if (!has(i) || get(i).is_none()) return fallback;
  const Value& v = get(i);
  if (v.is_undefined()) v.fail_undefined();
  if (!v.is_number() || v.is_float())
    type_error(function_ + "(): '" + names_[i] + "' must be an integer, not '" + type_name(v) + "'");
  return v.as_int();
}

std::optional<std::string> BoundArgs::string_or_none(size_t i) const {
  if (!has(i) || get(i).is_none()) return std::nullopt;
  const Value& v = get(i);
  if (v.is_undefined()) v.fail_undefined();
  if (!v.is_string()) type_error(function_ + "(): '" + names_[i] + "' must be a string, not '" + type_name(v) + "'");
  return v.as_string();
}

}  // namespace ktune::jinja
