// The errors of the Jinja engine. TemplateError is what a user sees: a ktune::Error whose place is
// the template's origin and line (and column, for syntax errors). EvalFault is internal: raised
// deep inside value operations and builtins, which do not know where in the template they run; the
// renderer catches it and rethrows it as a TemplateError with the line of the node being evaluated.
#pragma once

#include <stdexcept>
#include <string>

#include "core/error.h"

namespace ktune::jinja {

class TemplateError : public ktune::Error {
 public:
  TemplateError(std::string where, std::string what) : ktune::Error(std::move(where), std::move(what)) {}
};

// message is Python-shaped: "UndefinedError: 'x' is undefined", "TypeError: ...". A message from
// the template's own raise_exception() is carried verbatim, with no class prefix.
class EvalFault : public std::runtime_error {
 public:
  explicit EvalFault(const std::string& message) : std::runtime_error(message) {}
};

[[noreturn]] inline void fail(const std::string& message) { throw EvalFault(message); }
[[noreturn]] inline void type_error(const std::string& message) { throw EvalFault("TypeError: " + message); }

}  // namespace ktune::jinja

namespace ktune::jinja {

// "<origin>, line 3, column 14": the place a TemplateError names. column 0 leaves the column out.
inline std::string template_place(const std::string& origin, int line, int column = 0) {
  std::string place = origin + ", line " + std::to_string(line);
  if (column > 0) place += ", column " + std::to_string(column);
  return place;
}

[[noreturn]] inline void syntax_error(const std::string& origin, int line, int column, const std::string& message) {
  throw TemplateError(template_place(origin, line, column), "TemplateSyntaxError: " + message);
}

}  // namespace ktune::jinja
