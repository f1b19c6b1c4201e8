// The one error type of ktune: what failed and where (a file, a tensor, a config key, a line).
// Raised where the fault is found, printed once at the CLI boundary with a non-zero exit.
// It deliberately carries no stack trace and no error codes: the place is the message.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

namespace ktune {

class Error : public std::runtime_error {
 public:
  // where: "model.safetensors: tensor model.norm.weight", "config key optimizer.lr", "data.jsonl:12"
  Error(std::string where, std::string what);
  explicit Error(std::string what);

  const std::string& where() const { return where_; }
  const std::string& what_only() const { return what_; }

 private:
  std::string where_;
  std::string what_;
};

// Several problems found together (validation reports all of them at once).
class Errors : public std::runtime_error {
 public:
  explicit Errors(std::vector<Error> errors);
  const std::vector<Error>& errors() const { return errors_; }

 private:
  std::vector<Error> errors_;
};

// check(cond, where, what): throw Error(where, what) unless cond holds.
inline void check(bool condition, const std::string& where, const std::string& what) {
  if (!condition) throw Error(where, what);
}

}  // namespace ktune
