// Shared by the sdk tests: a temporary KTUNE_HOME per test (removed afterwards), a local backend
// configured to use the test supervisor binary, and polling with a deadline.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>

#include "sdk/local_backend.h"

namespace ktune::sdk::testing {

class TempHome {
 public:
  TempHome() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "ktune-sdk-test-XXXXXX").string();
    char* made = mkdtemp(tmpl.data());
    EXPECT_NE(made, nullptr);
    path_ = tmpl;
  }
  ~TempHome() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline BackendConfig local_config(const std::string& home) {
  BackendConfig c;
  c.home = home;
  c.ktune_exe = KTUNE_SDK_SUPERVISOR;
  c.stop_grace_seconds = 2;
  return c;
}

// Polls `done` every 20 ms until it holds or `seconds` pass; returns whether it held.
inline bool eventually(const std::function<bool()>& done, double seconds = 20) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return done();
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A step running `script` with /bin/sh.
inline PlanStep shell_step(const std::string& name, const std::string& script,
                           std::vector<std::string> depends_on = {}, int node_rank = -1) {
  PlanStep s;
  s.name = name;
  s.command = {"/bin/sh", "-c", script};
  s.working_dir = "/workspace";
  s.depends_on = std::move(depends_on);
  s.node_rank = node_rank;
  return s;
}

inline TrainJobPlan plan_of(std::vector<PlanStep> steps, const std::string& runtime = "test-runtime") {
  TrainJobPlan p;
  p.runtime_name = runtime;
  p.trainer_type = "CustomTrainer";
  p.steps = std::move(steps);
  return p;
}

}  // namespace ktune::sdk::testing
