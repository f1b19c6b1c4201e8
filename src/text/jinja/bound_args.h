// A builtin's arguments bound to its parameters the way Python binds def f(a, b=None, c=0):
// positionally in order, or by keyword, each at most once; unknown keywords and extra positional
// arguments raise TypeError naming the builtin.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "text/jinja/value.h"

namespace ktune::jinja {

class BoundArgs {
 public:
  // required: how many of the leading params must be given.
  BoundArgs(const CallArgs& args, const std::string& function, std::initializer_list<const char*> params,
            size_t required = 0);

  bool has(size_t i) const { return slots_[i] != nullptr; }
  const Value& get(size_t i) const { return *slots_[i]; }
  Value get_or(size_t i, Value fallback) const { return has(i) ? get(i) : fallback; }
  // The argument as a Python int / str / bool, or fallback when not given (None counts as not
  // given where noted by the caller). Raise TypeError for another type.
  int64_t int_or(size_t i, int64_t fallback) const;
  std::optional<std::string> string_or_none(size_t i) const;  // absent or None → nullopt
  bool bool_or(size_t i, bool fallback) const { return has(i) ? truthy(get(i)) : fallback; }

 private:
  std::string function_;
  std::vector<const char*> names_;
  std::vector<const Value*> slots_;
};

}  // namespace ktune::jinja
