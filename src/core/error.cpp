#include "core/error.h"

namespace ktune {

static std::string join_place(const std::string& where, const std::string& what) {
  return where.empty() ? what : where + ": " + what;
}

Error::Error(std::string where, std::string what)
    : std::runtime_error(join_place(where, what)), where_(std::move(where)), what_(std::move(what)) {}

Error::Error(std::string what) : Error(std::string(), std::move(what)) {}

static std::string join_errors(const std::vector<Error>& errors) {
  std::string message = std::to_string(errors.size()) + (errors.size() == 1 ? " error" : " errors");
  for (const Error& e : errors) message += "\n  - " + std::string(e.what());
  return message;
}

Errors::Errors(std::vector<Error> errors) : std::runtime_error(join_errors(errors)), errors_(std::move(errors)) {}

}  // namespace ktune
