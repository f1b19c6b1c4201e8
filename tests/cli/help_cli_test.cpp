// `ktune COMMAND --help` for every command `ktune --help` lists: the command's usage on stdout,
// nothing on stderr, exit 0 (as argparse and torchrun answer --help), whatever the command does
// with its other arguments. A wrong command line still goes to stderr with a non-zero exit (a
// mistyped recipe with the nearest name).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "tiny_recipe_run.h"

namespace ktune {
namespace {

using recipe_testing::kKtune;
using recipe_testing::Outcome;
using recipe_testing::sh;

// stdout, and separately what reached stderr.
struct Split {
  int exit_code;
  std::string out, err;
  bool any_stderr;
};
Split run_split(const std::string& args) {
  // One file a process: ctest runs this binary's tests as processes side by side.
  const std::string err_file = testing::TempDir() + "ktune_help_cli_stderr." + std::to_string(getpid()) + ".txt";
  Outcome r = sh("(" + kKtune + " " + args + " 2>" + err_file + ")");
  Outcome err = sh("cat " + err_file);
  std::remove(err_file.c_str());
  return {r.exit_code, r.output, err.output, !err.output.empty()};
}

// The command names of `ktune --help`'s list ("  NAME  summary" under "commands:").
std::vector<std::string> listed_commands() {
  Split help = run_split("--help");
  EXPECT_EQ(help.exit_code, 0);
  std::vector<std::string> names;
  std::istringstream lines(help.out);
  std::string line;
  bool in_list = false;
  while (std::getline(lines, line)) {
    if (line == "commands:") in_list = true;
    else if (in_list && line.rfind("  ", 0) == 0) names.push_back(line.substr(2, line.find(' ', 2) - 2));
  }
  return names;
}

TEST(HelpCli, EveryCommandAnswersHelpWithItsUsageOnStdout) {
  std::vector<std::string> commands = listed_commands();
  ASSERT_GE(commands.size(), 15u);
  for (const std::string& c : commands) {
    for (const char* flag : {"--help", "-h"}) {
      Split r = run_split(c + " " + flag);
      EXPECT_EQ(r.exit_code, 0) << c << " " << flag << ": " << r.out;
      EXPECT_EQ(r.out.rfind("usage: ktune " + c, 0), 0u) << c << " " << flag << ": " << r.out;
      EXPECT_FALSE(r.any_stderr) << c << " " << flag;
    }
  }
}

TEST(HelpCli, HelpAfterOtherFlagsStillAnswersAndAWrongCommandLineStillFails) {
  Split generate = run_split("generate --temperature 0.5 --help");
  EXPECT_EQ(generate.exit_code, 0);
  EXPECT_NE(generate.out.find("--repetition-penalty R"), std::string::npos) << generate.out;
  Split run = run_split("run --help");
  EXPECT_NE(run.out.find("lora_finetune_distributed"), std::string::npos) << run.out;  // the recipes
  EXPECT_NE(run.out.find("--nproc_per_node"), std::string::npos) << run.out;
  for (const char* wrong : {"generate --no-such-flag", "download", "export --from /tmp", "initializer", "run"}) {
    Split r = run_split(wrong);
    EXPECT_NE(r.exit_code, 0) << wrong;
    EXPECT_TRUE(r.any_stderr) << wrong;
  }
  Split typo = run_split("run lora_finetune_single_dvice --config llama3_2/1B_lora_single_device");
  EXPECT_NE(typo.exit_code, 0);
  EXPECT_NE(typo.err.find("did you mean `lora_finetune_single_device`?"), std::string::npos) << typo.err;
}

}  // namespace
}  // namespace ktune
