// The local backend's detached supervisor (`ktune jobs supervise NAME`): one single-threaded
// process per job that starts each step when its dependencies are Complete, relays the steps'
// output (secrets redacted) into their log files, records every transition in the registry, copies
// the trainer's progress into it, and stops the remaining steps on the first failure or on
// SIGTERM/SIGINT/SIGHUP. It never plans and never retries: a failed step fails the job.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "core/process_exit.h"
#include "sdk/job_registry.h"
#include "sdk/local_backend.h"
#include "sdk/process_identity.h"

extern char** environ;

namespace ktune::sdk {

namespace {

volatile sig_atomic_t g_stop_signal = 0;
void on_stop_signal(int sig) { g_stop_signal = sig; }

// A started step: its process, its output pipe and what is left of its last line.
struct RunningStep {
  size_t index = 0;
  pid_t pid = 0;
  long long start_time = 0;
  int out_fd = -1;        // read end of the step's stdout+stderr
  int log_fd = -1;        // the step's log file (append)
  std::string partial;    // output after the last line break
  bool exited = false;
  int exit_code = -1;
  std::string ended;  // how it ended, in words (describe_process_exit)
  double drain_deadline = 0;  // after exit: stop waiting for output held open by grandchildren
};

void write_all(int fd, const std::string& s) {
  for (size_t at = 0; at < s.size();) {
    ssize_t n = write(fd, s.data() + at, s.size() - at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    at += size_t(n);
  }
}

// Splits on '\n' and '\r' (progress bars redraw with '\r'), redacts, writes whole lines.
void relay_lines(RunningStep& r, bool flush_partial) {
  size_t start = 0;
  for (size_t i = 0; i < r.partial.size(); ++i) {
    char c = r.partial[i];
    if (c != '\n' && c != '\r') continue;
    if (i > start) write_all(r.log_fd, redact(r.partial.substr(start, i - start)) + "\n");
    start = i + 1;
  }
  r.partial.erase(0, start);
  // A line longer than 64 KiB is cut rather than buffered without bound.
  if ((flush_partial || r.partial.size() > 65536) && !r.partial.empty()) {
    write_all(r.log_fd, redact(r.partial) + "\n");
    r.partial.clear();
  }
}

// Reads what is available; returns false at end of file.
bool read_output(RunningStep& r) {
  char buf[65536];
  while (true) {
    ssize_t n = read(r.out_fd, buf, sizeof(buf));
    if (n > 0) {
      r.partial.append(buf, size_t(n));
      relay_lines(r, false);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    return false;  // EOF or error
  }
}

void close_output(RunningStep& r) {
  relay_lines(r, true);
  if (r.out_fd >= 0) close(r.out_fd);
  if (r.log_fd >= 0) close(r.log_fd);
  r.out_fd = r.log_fd = -1;
}

int exit_code_of(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return -1;
}

// Rewrites the rendezvous endpoint of a node step to this machine.
void localize_rendezvous(std::vector<std::string>& command, int port) {
  const std::string endpoint = "127.0.0.1:" + std::to_string(port);
  for (size_t i = 0; i < command.size(); ++i) {
    if (command[i].rfind("--rdzv_endpoint=", 0) == 0 || command[i].rfind("--rdzv-endpoint=", 0) == 0)
      command[i] = command[i].substr(0, command[i].find('=') + 1) + endpoint;
    else if ((command[i] == "--rdzv_endpoint" || command[i] == "--rdzv-endpoint") && i + 1 < command.size())
      command[++i] = endpoint;
  }
}

class Supervisor {
 public:
  Supervisor(JobRegistry& registry, TrainJobRecord job, nlohmann::json secrets)
      : registry_(registry), job_(std::move(job)), secrets_(std::move(secrets)) {}

  int run();

 private:
  bool start(size_t index);
  void reap();
  void finish_exited();
  void stop_all(double grace);
  void update_progress(bool force);
  void log_line(const std::string& msg) {
    std::fprintf(stderr, "%s\n", redact(msg).c_str());
    std::fflush(stderr);
  }

  JobRegistry& registry_;
  TrainJobRecord job_;
  nlohmann::json secrets_;
  std::map<pid_t, RunningStep> running_;
  std::vector<std::string> status_;  // per step index
  std::string failure_;
  int master_port_ = 0;
  double last_progress_check_ = 0;
  long long last_progress_size_ = -1;
};

bool Supervisor::start(size_t index) {
  StepRecord& step = job_.steps[index];
  std::vector<std::string> command = step.command;
  std::map<std::string, std::string> env = step.env;
  env["KTUNE_JOB_NAME"] = job_.name;
  env["KTUNE_STEP_NAME"] = step.name;
  env["KTUNE_WORKSPACE"] = job_.workspace;
  if (step.node_rank >= 0) {
    if (master_port_ == 0) master_port_ = free_local_port();
    const std::string port = std::to_string(master_port_);
    env["MASTER_ADDR"] = "127.0.0.1";
    env["MASTER_PORT"] = port;
    env["PET_MASTER_ADDR"] = "127.0.0.1";
    env["PET_MASTER_PORT"] = port;
    if (!env.count("PET_NODE_RANK")) env["PET_NODE_RANK"] = std::to_string(step.node_rank);
    if (!env.count("PET_NNODES")) env["PET_NNODES"] = std::to_string(job_.num_nodes);
    if (!env.count("PET_NPROC_PER_NODE")) env["PET_NPROC_PER_NODE"] = std::to_string(step.num_proc);
    localize_rendezvous(command, master_port_);
    if (!step.progress_path.empty()) env[kProgressFileEnv] = step.progress_path;
  }

  // Everything the child needs is built before fork.
  std::map<std::string, std::string> full_env;
  for (char** e = environ; *e; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq) full_env[std::string(*e, size_t(eq - *e))] = eq + 1;
  }
  for (const auto& [k, v] : env) full_env[k] = v;
  if (secrets_.contains(step.name))
    for (auto it = secrets_[step.name].begin(); it != secrets_[step.name].end(); ++it)
      full_env[it.key()] = it.value().get<std::string>();
  std::vector<std::string> env_s;
  for (const auto& [k, v] : full_env) env_s.push_back(k + "=" + v);
  std::vector<char*> envp, argv;
  for (std::string& s : env_s) envp.push_back(s.data());
  envp.push_back(nullptr);
  for (std::string& s : command) argv.push_back(s.data());
  argv.push_back(nullptr);
  const std::string cannot_cd = "ktune: cannot enter the working directory " + step.working_dir + "\n";
  const std::string cannot_exec = "ktune: cannot run '" + command[0] + "': ";

  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) {
    failure_ = "step " + step.name + ": cannot create its output pipe";
    return false;
  }
  int log_fd = open(step.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  const pid_t parent = getpid();
  // The stop signals stay blocked across the fork until the child has its default handlers back:
  // a SIGTERM that comes while it still has the supervisor's handler (as when a sibling fails the
  // moment this step starts) would otherwise only set a flag in the child, which would then run its
  // command to the end, or until SIGKILL, instead of ending at once. Blocked, it waits, then kills.
  sigset_t stop_signals, unblocked;
  sigemptyset(&stop_signals);
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) sigaddset(&stop_signals, sig);
  sigprocmask(SIG_BLOCK, &stop_signals, &unblocked);
  pid_t pid = fork();
  if (pid == 0) {
    signal(SIGPIPE, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    setpgid(0, 0);                        // its own group: stopping it stops all it started
    prctl(PR_SET_PDEATHSIG, SIGTERM);     // a killed supervisor takes its steps with it
    sigprocmask(SIG_SETMASK, &unblocked, nullptr);  // a stop signal that came meanwhile ends it here
    if (getppid() != parent) _exit(1);
    int null_fd = open("/dev/null", O_RDONLY);
    if (null_fd >= 0) dup2(null_fd, 0);
    dup2(out[1], 1);
    dup2(out[1], 2);
    if (chdir(step.working_dir.c_str()) != 0) {
      write_all(2, cannot_cd);
      _exit(127);
    }
    environ = envp.data();
    execvp(argv[0], argv.data());
    write_all(2, cannot_exec + std::strerror(errno) + "\n");
    _exit(127);
  }
  sigprocmask(SIG_SETMASK, &unblocked, nullptr);
  close(out[1]);
  if (pid < 0) {
    close(out[0]);
    if (log_fd >= 0) close(log_fd);
    failure_ = "step " + step.name + ": cannot fork";
    return false;
  }
  setpgid(pid, pid);  // also here, so the group exists before anyone signals it
  fcntl(out[0], F_SETFL, fcntl(out[0], F_GETFL) | O_NONBLOCK);
  RunningStep r;
  r.index = index;
  r.pid = pid;
  r.start_time = process_start_time(pid);
  r.out_fd = out[0];
  r.log_fd = log_fd >= 0 ? log_fd : open("/dev/null", O_WRONLY | O_CLOEXEC);
  running_[pid] = r;
  status_[index] = kRunning;
  registry_.mark_step_running(job_.name, step.name, pid, r.start_time, unix_now(), command, env);
  log_line("started step " + step.name + " (pid " + std::to_string(pid) + ")");
  return true;
}

void Supervisor::reap() {
  while (true) {
    int st = 0;
    struct rusage usage {};
    pid_t pid = wait4(-1, &st, WNOHANG, &usage);
    if (pid <= 0) return;
    auto it = running_.find(pid);
    if (it == running_.end()) continue;
    it->second.exited = true;
    it->second.exit_code = exit_code_of(st);
    it->second.ended = describe_process_exit(st, &usage, /*sent_by_parent=*/false);
    it->second.drain_deadline = unix_now() + 2.0;
  }
}

// A step is over when its process exited and its output is drained (or held open too long).
void Supervisor::finish_exited() {
  for (auto it = running_.begin(); it != running_.end();) {
    RunningStep& r = it->second;
    if (!r.exited || (r.out_fd >= 0 && unix_now() < r.drain_deadline)) {
      ++it;
      continue;
    }
    if (r.out_fd >= 0) read_output(r);
    close_output(r);
    const StepRecord& step = job_.steps[r.index];
    const bool ok = r.exit_code == 0;
    status_[r.index] = ok ? kComplete : kFailed;
    registry_.finish_step(job_.name, step.name, status_[r.index], r.exit_code, unix_now());
    log_line("step " + step.name + " exited with code " + std::to_string(r.exit_code));
    if (!ok && failure_.empty()) {
      failure_ = "step " + step.name + " " + r.ended + "; see `ktune jobs logs " + job_.name + " --step " + step.name + "`";
    }
    it = running_.erase(it);
  }
}

void Supervisor::stop_all(double grace) {
  for (auto& [pid, r] : running_) stop_process_group(pid, r.start_time, grace);
  // Everything got SIGTERM then (if needed) SIGKILL: wait for each and drain its output.
  for (auto& [pid, r] : running_) {
    int st = 0;
    if (!r.exited && waitpid(pid, &st, 0) == pid) {
      r.exited = true;
      r.exit_code = exit_code_of(st);
      r.ended = describe_process_exit(st, nullptr, /*sent_by_parent=*/true);
    }
    r.drain_deadline = 0;
  }
  for (auto& [pid, r] : running_)
    if (r.out_fd >= 0) read_output(r);
  finish_exited();
}

void Supervisor::update_progress(bool force) {
  const double now = unix_now();
  if (!force && now - last_progress_check_ < 1.0) return;
  last_progress_check_ = now;
  for (size_t i = 0; i < job_.steps.size(); ++i) {
    const StepRecord& s = job_.steps[i];
    if (s.node_rank != 0 || s.progress_path.empty()) continue;
    struct stat sb;
    if (stat(s.progress_path.c_str(), &sb) != 0) return;
    if (!force && sb.st_size == last_progress_size_) return;
    last_progress_size_ = sb.st_size;
    if (auto span = read_progress_file(s.progress_path)) {
      const bool finished = status_[i] == kComplete;
      std::optional<TrainJobRecord> fresh = registry_.find(job_.name);
      const double started = fresh && fresh->step(s.name) ? fresh->step(s.name)->started_at : 0;
      registry_.set_progress(job_.name, summarize_progress(*span, started, now, finished));
    }
    return;
  }
}

int Supervisor::run() {
  status_.assign(job_.steps.size(), kCreated);
  // How long a step gets between SIGTERM and SIGKILL when the job stops early.
  const char* grace_env = std::getenv("KTUNE_STOP_GRACE_SECONDS");
  const double grace = grace_env ? std::atof(grace_env) : 10.0;
  while (true) {
    if (g_stop_signal != 0 && failure_.empty())
      failure_ = "stopped by signal " + std::to_string(int(g_stop_signal));
    if (!failure_.empty()) break;
    // Start every step whose dependencies are all Complete.
    for (size_t i = 0; i < job_.steps.size() && failure_.empty(); ++i) {
      if (status_[i] != kCreated) continue;
      bool ready = true;
      for (const std::string& d : job_.steps[i].depends_on)
        for (size_t k = 0; k < job_.steps.size(); ++k)
          if (job_.steps[k].name == d && status_[k] != kComplete) ready = false;
      if (ready) start(i);
    }
    if (!failure_.empty()) break;
    if (running_.empty()) {
      bool all_complete = true;
      for (const std::string& s : status_) all_complete = all_complete && s == kComplete;
      if (!all_complete) failure_ = "some steps can never start: their dependencies did not complete";
      break;
    }
    std::vector<pollfd> fds;
    std::vector<pid_t> owners;
    for (auto& [pid, r] : running_)
      if (r.out_fd >= 0) {
        fds.push_back({r.out_fd, POLLIN, 0});
        owners.push_back(pid);
      }
    int n = poll(fds.data(), nfds_t(fds.size()), 200);
    if (n > 0) {
      for (size_t i = 0; i < fds.size(); ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        RunningStep& r = running_[owners[i]];
        if (!read_output(r)) {
          relay_lines(r, true);
          close(r.out_fd);
          r.out_fd = -1;
        }
      }
    }
    reap();
    finish_exited();
    update_progress(false);
  }
  stop_all(grace);
  update_progress(true);
  const double now = unix_now();
  if (failure_.empty()) {
    registry_.finish_job(job_.name, kComplete, "", now);
    log_line("job " + job_.name + " Complete");
    return 0;
  }
  registry_.fail_running_steps(job_.name, now);
  registry_.finish_job(job_.name, kFailed, failure_, now);
  log_line("job " + job_.name + " Failed: " + failure_);
  return 1;
}

}  // namespace

int run_supervisor(const std::string& home, const std::string& job_name, int ready_fd) {
  // Secrets first: until stdin is read the submitter is still writing them.
  std::string payload;
  char buf[4096];
  for (ssize_t n; (n = read(0, buf, sizeof(buf))) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    payload.append(buf, size_t(n));
  }
  nlohmann::json secrets = nlohmann::json::parse(payload.empty() ? "{}" : payload, nullptr, false);
  if (!secrets.is_object()) secrets = nlohmann::json::object();
  for (auto& [step, kv] : secrets.items())
    for (auto& [k, v] : kv.items())
      if (v.is_string()) register_secret(v.get<std::string>());
  int null_fd = open("/dev/null", O_RDONLY);
  if (null_fd >= 0) {
    dup2(null_fd, 0);
    close(null_fd);
  }

  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;  // no SA_RESTART: poll() returns and the loop sees the flag
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGHUP, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  JobRegistry registry(home + "/registry.db");
  std::optional<TrainJobRecord> job = registry.find(job_name);
  if (!job) {
    std::fprintf(stderr, "ktune jobs supervise: no job %s in %s/registry.db\n", job_name.c_str(), home.c_str());
    return 2;
  }
  registry.set_supervisor(job_name, getpid(), process_start_time(getpid()));
  registry.mark_job_running(job_name, unix_now());
  if (ready_fd >= 0) {
    write_all(ready_fd, "ok\n");
    close(ready_fd);
  }
  std::fprintf(stderr, "supervising job %s (pid %d)\n", job_name.c_str(), int(getpid()));
  Supervisor supervisor(registry, std::move(*job), std::move(secrets));
  try {
    return supervisor.run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ktune jobs supervise: %s\n", redact(e.what()).c_str());
    registry.fail_running_steps(job_name, unix_now());
    registry.finish_job(job_name, kFailed, std::string("the supervisor failed: ") + redact(e.what()), unix_now());
    return 1;
  }
}

int supervise_command(const std::vector<std::string>& args) {
  std::string home = default_ktune_home(), name;
  int ready_fd = -1;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--home" && i + 1 < args.size()) home = args[++i];
    else if (args[i] == "--ready-fd" && i + 1 < args.size()) ready_fd = std::atoi(args[++i].c_str());
    else if (!args[i].empty() && args[i][0] != '-' && name.empty()) name = args[i];
    else {
      std::fprintf(stderr, "usage: ktune jobs supervise [--home DIR] [--ready-fd N] NAME\n");
      return 2;
    }
  }
  if (name.empty()) {
    std::fprintf(stderr, "usage: ktune jobs supervise [--home DIR] [--ready-fd N] NAME\n");
    return 2;
  }
  return run_supervisor(home, name, ready_fd);
}

}  // namespace ktune::sdk
