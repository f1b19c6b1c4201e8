// A subcommand's arguments, read left to right: `--flag VALUE` or `--flag=VALUE`, bare switches
// (`--chat`), and positional words. Every cmd_<name>.cpp reads its arguments through it, so that each
// says only which flags it knows and what they mean; the reading itself, the "needs a value" and
// "not an integer" errors (each naming the command and the flag) are written once, here.
// It deliberately knows no flag itself, and does not parse `ktune run`'s command line (torchrun's
// and torchtune's grammar: train/run_command_line.h).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "cli/command_table.h"

namespace ktune::cli {

// `-h` or `--help`: the command prints its usage to stdout and exits 0.
inline bool is_help_flag(std::string_view arg) { return arg == "-h" || arg == "--help"; }

class FlagArgs {
 public:
  // command: what errors name ("ktune plan"); reading starts at args[first].
  FlagArgs(std::string command, const Args& args, size_t first = 0);

  // Moves to the next argument; false when none is left.
  bool next();
  // The current argument: a flag without its `=VALUE` part, or a positional word.
  const std::string& arg() const { return arg_; }
  bool is(std::string_view flag) const { return arg_ == flag; }
  bool help() const { return is_help_flag(arg_); }  // the current argument asks for the usage
  // A word that is not a flag (does not start with '-', or is exactly "-").
  bool positional() const;

  // The current flag's value: its `=VALUE`, else the next argument. Error when there is none.
  std::string value();
  // value() as an integer in [min, max], a number, or a boolean (true/false/1/0). Errors name the flag.
  long long int_value(long long min, long long max);
  double number_value();
  bool bool_value();
  // A switch that may be told its value: bare (`--use-dora`) is true, `--use-dora=false` is false.
  bool switch_value();

  // Error: the current argument is not one this command knows; usage ("usage: ktune …"), if given,
  // follows on a line of its own.
  [[noreturn]] void unknown(const std::string& usage) const;
  // Error: a switch was given a value (`--chat=yes`).
  void expect_no_value() const;

  const std::string& command() const { return command_; }

 private:
  std::string where() const { return command_ + " " + arg_; }

  std::string command_;
  const Args& args_;
  size_t next_ = 0;
  std::string arg_;
  bool has_inline_value_ = false;
  std::string inline_value_;
};

}  // namespace ktune::cli
