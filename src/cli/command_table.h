// The ktune subcommands. Each lives in its own cmd_<name>.cpp and is listed once in main.cpp's
// table; a subcommand takes the arguments after its name and returns the process exit code.
#pragma once

#include <string>
#include <vector>

namespace ktune::cli {

using Args = std::vector<std::string>;

struct Command {
  const char* name;
  const char* summary;
  int (*run)(const Args& args);
};

}  // namespace ktune::cli
