// Reading a subcommand's flags. See flag_args.h.
#include "cli/flag_args.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "core/error.h"

namespace ktune::cli {

FlagArgs::FlagArgs(std::string command, const Args& args, size_t first)
    : command_(std::move(command)), args_(args), next_(first) {}

bool FlagArgs::next() {
  if (next_ >= args_.size()) return false;
  arg_ = args_[next_++];
  has_inline_value_ = false;
  inline_value_.clear();
  const size_t eq = arg_.find('=');
  if (arg_.rfind("--", 0) == 0 && eq != std::string::npos) {
    inline_value_ = arg_.substr(eq + 1);
    arg_ = arg_.substr(0, eq);
    has_inline_value_ = true;
  }
  return true;
}

bool FlagArgs::positional() const { return arg_.empty() || arg_[0] != '-' || arg_ == "-"; }

std::string FlagArgs::value() {
  if (has_inline_value_) return inline_value_;
  if (next_ >= args_.size()) throw Error(where(), "needs a value");
  return args_[next_++];
}

long long FlagArgs::int_value(long long min, long long max) {
  const std::string text = value();
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE)
    throw Error(where(), "expects an integer, got '" + text + "'");
  if (v < min || v > max)
    throw Error(where(), "expects an integer in [" + std::to_string(min) + ", " + std::to_string(max) + "], got " + text);
  return v;
}

double FlagArgs::number_value() {
  const std::string text = value();
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(v)) throw Error(where(), "expects a number, got '" + text + "'");
  return v;
}

bool FlagArgs::bool_value() {
  const std::string text = value();
  if (text == "true" || text == "True" || text == "1") return true;
  if (text == "false" || text == "False" || text == "0") return false;
  throw Error(where(), "expects true or false, got '" + text + "'");
}

bool FlagArgs::switch_value() { return has_inline_value_ ? bool_value() : true; }

void FlagArgs::unknown(const std::string& usage) const {
  throw Error(command_, "unknown argument '" + arg_ + "'" + (usage.empty() ? "" : "\n" + usage));
}

void FlagArgs::expect_no_value() const {
  if (has_inline_value_) throw Error(where(), "takes no value, got '" + inline_value_ + "'");
}

}  // namespace ktune::cli
