// The trainer's config checked by `ktune validate` before a job starts (see trainer_config_check.h).
#include "sdk/trainer_config_check.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

#include "core/error.h"

extern char** environ;

namespace ktune::sdk {

namespace {

// The node step that runs the trainer: "node-0", else the first step of the node replicated job.
const PlanStep* trainer_step(const TrainJobPlan& plan) {
  for (const PlanStep& s : plan.steps)
    if (s.name == "node-0") return &s;
  for (const PlanStep& s : plan.steps)
    if (s.replicated_job == "node") return &s;
  return nullptr;
}

// The overrides after `--config CONFIG` (or `--config=CONFIG`); nullopt without a --config.
std::optional<std::vector<std::string>> overrides_after_config(const std::vector<std::string>& command) {
  for (size_t i = 0; i < command.size(); ++i) {
    size_t first = 0;
    if (command[i] == "--config" && i + 1 < command.size()) first = i + 2;
    else if (command[i].rfind("--config=", 0) == 0) first = i + 1;
    else continue;
    return std::vector<std::string>(command.begin() + (ptrdiff_t)first, command.end());
  }
  return std::nullopt;
}

struct Captured {
  int exit_code = -1;  // -1: killed by a signal or by the timeout
  bool timed_out = false;
  std::string output;  // stdout and stderr together
};

// Runs argv with stdout and stderr into one pipe; kills it after timeout_seconds.
Captured run_captured(const std::vector<std::string>& argv, double timeout_seconds) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw Error("trainer config check", std::string("pipe: ") + std::strerror(errno));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    throw Error("trainer config check", "cannot run " + argv[0] + ": " + std::strerror(rc));
  }
  Captured out;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
  char buf[4096];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      out.timed_out = true;
      kill(pid, SIGKILL);
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    const int ready = poll(&p, 1, (int)std::min<int64_t>(left.count(), 1000));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;
    const ssize_t n = read(fds[0], buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.output.append(buf, (size_t)n);
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!out.timed_out && WIFEXITED(status)) out.exit_code = WEXITSTATUS(status);
  return out;
}

std::string joined(const std::vector<std::string>& words, size_t from) {
  std::string out;
  for (size_t i = from; i < words.size(); ++i) out += (out.empty() ? "" : " ") + words[i];
  return out;
}

}  // namespace

std::optional<std::vector<std::string>> trainer_config_check_command(const TrainJobPlan& plan,
                                                                     const RuntimeCatalog& catalog,
                                                                     const std::string& ktune_exe) {
  if (plan.framework != "torchtune" || plan.recipe.empty() || plan.config.empty() || ktune_exe.empty()) return std::nullopt;
  if (!catalog.configs().contains(plan.config)) return std::nullopt;
  const PlanStep* node = trainer_step(plan);
  if (node == nullptr) return std::nullopt;
  std::optional<std::vector<std::string>> overrides = overrides_after_config(node->command);
  if (!overrides) return std::nullopt;
  std::vector<std::string> argv{ktune_exe, "validate", plan.config, "--recipe", plan.recipe};
  argv.insert(argv.end(), overrides->begin(), overrides->end());
  return argv;
}

void check_trainer_config(const TrainJobPlan& plan, const RuntimeCatalog& catalog, const std::string& ktune_exe,
                          double timeout_seconds) {
  const std::optional<std::vector<std::string>> argv = trainer_config_check_command(plan, catalog, ktune_exe);
  if (!argv) return;
  const Captured result = run_captured(*argv, timeout_seconds);
  if (result.exit_code == 0) return;
  std::string report = result.output;
  while (!report.empty() && (report.back() == '\n' || report.back() == ' ')) report.pop_back();
  if (report.rfind("error: ", 0) == 0) report = report.substr(7);
  const std::string how = "`ktune validate " + joined(*argv, 2) + "`";
  if (result.timed_out)
    throw Error("trainer config " + plan.config, how + " did not finish in " + std::to_string((int)timeout_seconds) + " s");
  if (result.exit_code != 1)  // validate says 1 for a refused config; anything else is the checker's own failure
    throw Error("trainer config " + plan.config, how + " failed (exit " + std::to_string(result.exit_code) + "): " + report);
  throw Error("trainer config " + plan.config, "the trainer would refuse this job's config (" + how + "): " + report);
}

}  // namespace ktune::sdk
