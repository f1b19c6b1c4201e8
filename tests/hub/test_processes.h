// Test support for the hub tests: start a helper server script (python3) on loopback and stop it
// when the test is done, run the built `ktune` binary with a chosen environment and capture its
// output, and small file helpers. A server's lifetime is bounded three ways: the destructor kills
// it, it exits when its stdin (a pipe held here) closes, and it has its own --max-seconds timer.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace ktune::hub::testing {

inline std::string source_dir() {
  const char* s = std::getenv("KTUNE_SOURCE_DIR");
  return s != nullptr ? s : KTUNE_SOURCE_DIR;
}

inline std::string binary_dir() {
  const char* s = std::getenv("KTUNE_BINARY_DIR");
  return s != nullptr ? s : KTUNE_BINARY_DIR;
}

inline bool python_has(const std::string& module) {
  std::string cmd = "python3 -c 'import " + module + "' >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0;
}

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline void write_file(const std::string& path, const std::string& data) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream f(path, std::ios::binary);
  f << data;
}

// A fresh folder under the system temp dir, removed by the destructor.
struct TempDir {
  std::string path;
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "ktune-hub-XXXXXX").string();
    path = mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string operator/(const std::string& rel) const { return path + "/" + rel; }
};

// Every file under `root` (relative paths), for "no token in any file" checks.
inline std::vector<std::string> all_files(const std::string& root) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(root))
    if (e.is_regular_file()) out.push_back(std::filesystem::relative(e.path(), root).string());
  return out;
}

// A helper server: `python3 script args...` printing one JSON line on stdout when ready.
class ServerProcess {
 public:
  ServerProcess(const std::string& script, const std::vector<std::string>& args, int ready_timeout_s = 60) {
    int in_pipe[2], out_pipe[2];
    if (pipe(in_pipe) != 0 || pipe(out_pipe) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(in_pipe[0], 0);
      dup2(out_pipe[1], 1);
      close(in_pipe[1]);
      close(out_pipe[0]);
      std::vector<std::string> argv_s = {"python3", script};
      argv_s.insert(argv_s.end(), args.begin(), args.end());
      std::vector<char*> argv;
      for (auto& s : argv_s) argv.push_back(s.data());
      argv.push_back(nullptr);
      execvp("python3", argv.data());
      _exit(127);
    }
    close(in_pipe[0]);
    close(out_pipe[1]);
    stdin_fd_ = in_pipe[1];
    int out_fd = out_pipe[0];
    std::string line;
    pollfd p{out_fd, POLLIN, 0};
    while (line.find('\n') == std::string::npos && poll(&p, 1, ready_timeout_s * 1000) > 0) {
      char buf[4096];
      ssize_t n = read(out_fd, buf, sizeof buf);
      if (n <= 0) break;
      line.append(buf, size_t(n));
    }
    close(out_fd);
    try {
      info_ = nlohmann::json::parse(line.substr(0, line.find('\n')));
    } catch (...) {
      info_ = nullptr;
    }
  }
  ~ServerProcess() {
    if (stdin_fd_ >= 0) close(stdin_fd_);
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int status = 0;
      waitpid(pid_, &status, 0);
    }
  }
  bool ready() const { return info_.is_object(); }
  const nlohmann::json& info() const { return info_; }
  int port() const { return info_.value("port", 0); }

 private:
  pid_t pid_ = -1;
  int stdin_fd_ = -1;
  nlohmann::json info_;
};

struct CommandResult {
  int exit_code = -1;
  std::string out, err;
};

// Runs argv with the current environment plus `env` (a value of "\x01" unsets the variable).
// Everything the child needs (argv, envp, the output paths) is made before fork(): tests call this
// from threads, and a child of a multi-threaded process may only make async-signal-safe calls (a
// malloc or setenv there can deadlock on a lock another thread held at the fork).
inline CommandResult run_command(const std::vector<std::string>& argv_s, const std::map<std::string, std::string>& env) {
  TempDir tmp;
  const std::string out_path = tmp / "out", err_path = tmp / "err";
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string key = entry.substr(0, entry.find('='));
    if (env.count(key) == 0) env_strings.push_back(entry);
  }
  for (const auto& [k, v] : env)
    if (v != "\x01") env_strings.push_back(k + "=" + v);
  std::vector<std::string> argv_copy = argv_s;
  std::vector<char*> argv, envp;
  for (auto& s : argv_copy) argv.push_back(s.data());
  argv.push_back(nullptr);
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    int o = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int e = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int devnull = open("/dev/null", O_RDONLY);
    dup2(devnull, 0);
    dup2(o, 1);
    dup2(e, 2);
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  CommandResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = read_file(out_path);
  r.err = read_file(err_path);
  return r;
}

inline std::string ktune_binary() { return binary_dir() + "/bin/ktune"; }

}  // namespace ktune::hub::testing
