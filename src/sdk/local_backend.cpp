// LocalBackend's client side: submitting (workspace, registry record, detached supervisor),
// reading jobs (with dead-supervisor reconciliation), following logs and deleting. The
// supervisor's own loop is in job_supervisor.cpp.
#include "sdk/local_backend.h"
#include "sdk/kubernetes_backend.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include "core/error.h"
#include "core/log.h"
#include "runtime/trainjob_builder.h"
#include "sdk/process_identity.h"

namespace fs = std::filesystem;

namespace ktune::sdk {

namespace {

constexpr double kSupervisorStartTimeoutSeconds = 30;

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return (v && *v) ? std::string(v) : fallback;
}

std::vector<std::string> split_spaces(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

bool is_ktune_name(const std::string& path) {
  std::string base = fs::path(path).filename().string();
  return base == "ktune" || base == "tune";
}

std::string find_on_path(const std::string& exe) {
  std::istringstream path(env_or("PATH", ""));
  for (std::string dir; std::getline(path, dir, ':');) {
    if (dir.empty()) continue;
    fs::path p = fs::path(dir) / exe;
    if (access(p.c_str(), X_OK) == 0) return p.string();
  }
  return "";
}


std::string tail_of_file(const std::string& path, size_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (text.size() > max_bytes) text = text.substr(text.size() - max_bytes);
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

// Checks names, dependencies (known, acyclic) and commands before anything is written.
void check_plan(const TrainJobPlan& plan) {
  const std::string where = "plan of job " + plan.job_name;
  check(!plan.steps.empty(), where, "the plan has no steps");
  std::set<std::string> names;
  for (const PlanStep& s : plan.steps) {
    check(!s.name.empty(), where, "a step has no name");
    check(s.name.find('/') == std::string::npos && s.name != "." && s.name != ".." && s.name != "supervisor",
          where + ": step " + s.name, "a step name must be a plain file name and not 'supervisor'");
    check(names.insert(s.name).second, where + ": step " + s.name, "two steps have this name");
    check(!s.command.empty() && !s.command[0].empty(), where + ": step " + s.name, "the step has no command");
  }
  for (const PlanStep& s : plan.steps)
    for (const std::string& d : s.depends_on)
      check(names.count(d) > 0, where + ": step " + s.name, "depends on unknown step '" + d + "'");
  // Kahn's algorithm: every step must become startable.
  std::map<std::string, std::vector<std::string>> deps;
  for (const PlanStep& s : plan.steps) deps[s.name] = s.depends_on;
  std::set<std::string> done;
  for (bool progress = true; progress && done.size() < names.size();) {
    progress = false;
    for (auto& [name, ds] : deps) {
      if (done.count(name)) continue;
      bool ready = true;
      for (const std::string& d : ds) ready = ready && done.count(d);
      if (ready) {
        done.insert(name);
        progress = true;
      }
    }
  }
  check(done.size() == names.size(), where, "the steps' dependencies form a cycle");
}

// Upstream's Labels, Annotations and ActiveDeadlineSeconds options are the Kubernetes backend's
// (its options refuse every other backend): the TrainJob's fields that set them are refused here,
// with upstream's wording; so are the plan's other Kubernetes-only parts (a DataCacheInitializer, a
// CustomTrainerContainer, TrainerCommand, TrainerArgs). A plan with them still prints (`--dry-run` renders the TrainJob).
void refuse_kubernetes_only_fields(const TrainJobPlan& plan) {
  if (plan.trainjob_json.empty()) return;
  const nlohmann::json job = nlohmann::json::parse(plan.trainjob_json, nullptr, false);
  if (job.is_discarded()) return;
  const auto present = [&](const char* section, const char* key) {
    return job.contains(section) && job[section].contains(key) && !job[section][key].empty();
  };
  for (const auto& [section, key, option] : {std::tuple{"metadata", "labels", "Labels"},
                                            std::tuple{"metadata", "annotations", "Annotations"},
                                            std::tuple{"spec", "activeDeadlineSeconds", "ActiveDeadlineSeconds"}})
    if (present(section, key))  // Errors: the caller's argument (upstream raises ValueError)
      throw Errors({Error("job " + plan.job_name,
                          std::string(option) + " option is not compatible with the local backend. Supported backends: kubernetes")});
  if (plan.kubernetes_only.empty()) return;
  const std::string& part = plan.kubernetes_only.front();  // the first is enough to refuse the plan
  throw Errors({Error("job " + plan.job_name,
                      part == "CustomTrainerContainer"
                          ? "CustomTrainerContainer runs a container image, which the local backend cannot (it runs "
                            "processes on this machine): use a CustomTrainer or a BuiltinTrainer here, or the kubernetes backend"
                      : part == "DataCacheInitializer"
                          ? "DataCacheInitializer needs the data cache's nodes, which a cluster runtime runs (upstream's "
                            "torch-distributed-with-cache): use the kubernetes backend, or a Hugging Face, S3 or file:// dataset here"
                          : part + " option is not compatible with the local backend. Supported backends: kubernetes")});
}

}  // namespace

std::string resolve_ktune_exe(const std::string& configured) {
  if (!configured.empty()) return configured;
  std::string from_env = env_or("KTUNE_EXE", "");
  if (!from_env.empty()) return from_env;
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec && is_ktune_name(self.string())) return self.string();
  return find_on_path("ktune");
}

std::string default_ktune_home() {
  std::string home = env_or("KTUNE_HOME", "");
  if (!home.empty()) return home;
  return env_or("HOME", "/tmp") + "/.ktune";
}

BackendConfig BackendConfig::from_env() {
  BackendConfig c;
  std::string kind = env_or("KTUNE_BACKEND", "local");
  if (kind == "kubernetes") c.kind = Kind::Kubernetes;
  else check(kind == "local", "KTUNE_BACKEND", "unknown backend '" + kind + "' (expected local or kubernetes)");
  c.home = env_or("KTUNE_HOME", "");
  c.ktune_exe = env_or("KTUNE_EXE", "");
  c.trainer_command = split_spaces(env_or("KTUNE_TRAINER_COMMAND", ""));
  c.kubernetes_namespace = env_or("KTUNE_NAMESPACE", c.kubernetes_namespace);
  c.kubernetes_context = env_or("KTUNE_KUBE_CONTEXT", c.kubernetes_context);
  return c;
}

bool BackendConfig::is_flag(const std::string& flag) {
  return flag == "--backend" || flag == "--namespace" || flag == "-n" || flag == "--kubeconfig" || flag == "--context";
}

bool BackendConfig::apply_flag(const std::string& flag, const std::string& value) {
  if (flag == "--backend") {
    if (value == "local") kind = Kind::Local;
    else if (value == "kubernetes" || value == "k8s") kind = Kind::Kubernetes;
    else throw Error("--backend", "unknown backend '" + value + "' (expected local or kubernetes)");
  } else if (flag == "--namespace" || flag == "-n") {
    kubernetes_namespace = value;
  } else if (flag == "--kubeconfig") {
    kubeconfig = value;
  } else if (flag == "--context") {
    kubernetes_context = value;
  } else {
    return false;
  }
  return true;
}

std::unique_ptr<Backend> make_backend(const BackendConfig& config) {
  if (config.kind == BackendConfig::Kind::Local) return std::make_unique<LocalBackend>(config);
  return std::make_unique<KubernetesBackend>(config);
}

LocalBackend::LocalBackend(BackendConfig config) : config_(std::move(config)) {
  if (config_.home.empty()) config_.home = default_ktune_home();
  if (config_.workspace_root.empty()) config_.workspace_root = config_.home + "/jobs";
  config_.ktune_exe = resolve_ktune_exe(config_.ktune_exe);
  if (config_.trainer_command.empty()) config_.trainer_command = split_spaces(env_or("KTUNE_TRAINER_COMMAND", ""));
  std::error_code ec;
  fs::create_directories(config_.home, ec);
  check(!ec, config_.home, "cannot create the ktune home directory: " + ec.message());
  registry_path_ = config_.home + "/registry.db";
}

JobRegistry& LocalBackend::registry() {
  if (!registry_) registry_ = std::make_unique<JobRegistry>(registry_path_);
  return *registry_;
}

std::string LocalBackend::submit(const TrainJobPlan& plan_in) {
  refuse_kubernetes_only_fields(plan_in);
  check_plan(plan_in);
  const std::string name = plan_in.job_name.empty() ? generate_job_name() : plan_in.job_name;
  check(!config_.ktune_exe.empty(), "local backend",
        "cannot find the ktune binary that supervises local jobs: put `ktune` on PATH or set KTUNE_EXE");
  check(!registry().find(name), "job " + name,
        "a TrainJob with this name already exists (ktune jobs delete " + name + " --workspace frees the name)");

  const std::string workspace = fs::absolute(fs::path(config_.workspace_root) / name).lexically_normal().string();
  std::error_code ec;
  check(!fs::exists(workspace) || fs::is_empty(workspace), workspace,
        "the job's workspace already exists and is not empty (left by a deleted job " + name +
            "? remove it, or delete jobs with --workspace / delete_job(name, remove_workspace=True))");
  for (const char* sub : {"", "/logs", "/progress"}) {
    fs::create_directories(workspace + sub, ec);
    check(!ec, workspace + sub, "cannot create the job workspace: " + ec.message());
  }
  // The job's directory plays the plan's /workspace: its paths in args, env and working dirs move there.
  const TrainJobPlan plan = plan_in.with_workspace(workspace);

  TrainJobRecord job;
  job.name = name;
  job.runtime = plan.runtime_name;
  job.trainer_type = plan.trainer_type;
  job.num_nodes = plan.num_nodes;
  job.num_proc_per_node = plan.num_proc_per_node;
  job.recipe = plan.recipe;
  job.config = plan.config;
  job.created_at = unix_now();
  job.workspace = workspace;
  nlohmann::json secrets = nlohmann::json::object();
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    const PlanStep& p = plan.steps[i];
    StepRecord s;
    s.name = p.name;
    s.index = int(i);
    s.command = p.command;
    const bool is_node = p.node_rank >= 0;
    const bool tune_run = s.command.size() >= 2 && is_ktune_name(s.command[0]) && s.command[0].find('/') == std::string::npos &&
                          s.command[1] == "run";
    if (is_node && tune_run && !config_.trainer_command.empty()) {
      std::vector<std::string> replaced = config_.trainer_command;
      replaced.insert(replaced.end(), s.command.begin() + 2, s.command.end());
      s.command = std::move(replaced);
    } else if ((s.command[0] == "tune" || s.command[0] == "ktune") && is_ktune_name(config_.ktune_exe)) {
      s.command[0] = config_.ktune_exe;  // the local trainer is this ktune, never a torchtune on PATH
    }
    s.env = p.env;
    for (const auto& [k, v] : p.secret_env) {
      s.secret_env_keys.push_back(k);
      secrets[p.name][k] = v;
    }
    s.working_dir = p.working_dir.empty() ? workspace : p.working_dir;
    s.depends_on = p.depends_on;
    s.node_rank = p.node_rank;
    s.num_proc = std::max(1, p.num_proc);
    // What the step runs on here: the plan's GPUs only where this machine has NVIDIA GPUs (the
    // runtimes ask for GPUs a laptop lacks), else the CPU with one process per plan process.
    const bool has_gpu = fs::exists("/dev/nvidiactl");
    if (p.device == "gpu" && has_gpu) {
      s.device = p.device;
      s.device_count = p.device_count;
    } else {
      s.device = "cpu";
      s.device_count = std::to_string(s.num_proc);
    }
    s.log_path = workspace + "/logs/" + p.name + ".log";
    if (is_node) s.progress_path = workspace + "/progress/" + p.name + ".jsonl";
    job.steps.push_back(std::move(s));
  }
  registry().insert(job);

  // Detach the supervisor: fork, setsid, fork again (so it is no child of ours and no session
  // leader: it can never get a controlling terminal), exec `ktune jobs supervise`.
  // Secrets go through a socket (send with MSG_NOSIGNAL: a supervisor that died early must not
  // kill us with SIGPIPE); readiness comes back through a pipe.
  const std::string log_path = workspace + "/logs/supervisor.log";
  std::vector<std::string> argv_s = {config_.ktune_exe, "jobs", "supervise", "--home", config_.home,
                                     "--ready-fd", "3", name};
  std::vector<char*> argv;
  for (std::string& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  int secret_socks[2], ready_pipe[2];
  check(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, secret_socks) == 0, "local backend", "socketpair failed");
  if (pipe2(ready_pipe, O_CLOEXEC) != 0) {
    close(secret_socks[0]);
    close(secret_socks[1]);
    throw Error("local backend", "pipe failed");
  }
  int log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  pid_t child = fork();
  if (child == 0) {
    // Only async-signal-safe calls from here to exec.
    setsid();
    if (fork() != 0) _exit(0);
    dup2(secret_socks[1], 0);
    if (log_fd >= 0) {
      dup2(log_fd, 1);
      dup2(log_fd, 2);
    } else if (null_fd >= 0) {
      dup2(null_fd, 1);
      dup2(null_fd, 2);
    }
    dup2(ready_pipe[1], 3);
    for (int fd = 4; fd < 1024; ++fd) close(fd);  // nothing of ours (the registry's db) leaks in
    execv(argv[0], argv.data());
    static const char msg[] = "ktune: cannot exec the job supervisor\n";
    (void)!write(2, msg, sizeof(msg) - 1);
    _exit(127);
  }
  close(secret_socks[1]);
  close(ready_pipe[1]);
  if (log_fd >= 0) close(log_fd);
  if (null_fd >= 0) close(null_fd);
  auto fail = [&](const std::string& why) {
    close(secret_socks[0]);
    close(ready_pipe[0]);
    registry().finish_job(name, kFailed, why, unix_now());
    throw Error("job " + name, why);
  };
  if (child < 0) fail("cannot fork the job supervisor");
  int status = 0;
  waitpid(child, &status, 0);

  const std::string payload = secrets.dump();
  for (size_t sent = 0; sent < payload.size();) {
    ssize_t n = send(secret_socks[0], payload.data() + sent, payload.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the supervisor is gone: the ready check below reports it
    sent += size_t(n);
  }
  close(secret_socks[0]);

  std::string ready;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(kSupervisorStartTimeoutSeconds);
  while (ready.find('\n') == std::string::npos) {
    int left_ms = int(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count());
    if (left_ms <= 0) break;
    pollfd pfd{ready_pipe[0], POLLIN, 0};
    int r = poll(&pfd, 1, left_ms);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    char buf[64];
    ssize_t n = read(ready_pipe[0], buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    ready.append(buf, size_t(n));
  }
  if (ready.rfind("ok", 0) != 0) {
    std::string why = "the job supervisor did not start";
    std::string tail = redact(tail_of_file(log_path, 600));
    if (!tail.empty()) why += ": " + tail;
    fail(why);
  }
  close(ready_pipe[0]);
  return name;
}

void LocalBackend::reconcile(TrainJobRecord& job) {
  if (is_terminal(job.status)) return;
  const double now = unix_now();
  std::string reason;
  if (job.supervisor_pid == 0) {
    if (now - job.created_at < kSupervisorStartTimeoutSeconds + 5) return;  // submit() is still starting it
    reason = "the job's supervisor never started (the submitting command died before it could)";
  } else if (process_is_alive(job.supervisor_pid, job.supervisor_start_time)) {
    return;
  } else {
    reason = "the job's supervisor (pid " + std::to_string(job.supervisor_pid) +
             ") ended without recording a final status: it was killed or crashed (see " + job.workspace +
             "/logs/supervisor.log)";
  }
  if (registry().fail_job_if_supervisor(job.name, job.supervisor_pid, reason, now)) {
    for (const StepRecord& s : job.steps)
      if (s.status == kRunning && s.pid > 0) stop_process_group(s.pid, s.pid_start_time, config_.stop_grace_seconds);
    registry().fail_running_steps(job.name, unix_now());
  }
  if (auto fresh = registry().find(job.name)) job = std::move(*fresh);
}

std::vector<TrainJobRecord> LocalBackend::list_jobs(const std::string& runtime) {
  std::vector<TrainJobRecord> jobs = registry().list(runtime);
  for (TrainJobRecord& j : jobs) reconcile(j);
  return jobs;
}

TrainJobRecord LocalBackend::get_job(const std::string& name) {
  std::optional<TrainJobRecord> job = registry().find(name);
  if (!job) throw Error("job " + name, "no TrainJob with this name (see `ktune jobs list`)");
  reconcile(*job);
  // The progress file is fresher than the registry's copy (the supervisor copies it once a second).
  for (const StepRecord& s : job->steps) {
    if (s.node_rank != 0 || s.progress_path.empty()) continue;
    if (auto span = read_progress_file(s.progress_path)) {
      const bool finished = s.status == kComplete;
      job->progress = summarize_progress(*span, s.started_at, finished ? s.finished_at : unix_now(), finished);
    }
    break;
  }
  return *job;
}

void LocalBackend::get_job_logs(const std::string& name, const std::string& step_name, bool follow,
                                const LogLineSink& sink) {
  TrainJobRecord job = get_job(name);
  const StepRecord* step = job.step(step_name);
  if (!step) {
    std::string names;
    for (const StepRecord& s : job.steps) names += (names.empty() ? "" : ", ") + s.name;
    throw Error("job " + name, "no step '" + step_name + "' (steps: " + names + ")");
  }
  const std::string path = step->log_path;
  std::ifstream in;
  std::string partial;
  auto drain = [&]() -> bool {  // false when the sink asked to stop
    if (!in.is_open()) {
      in.open(path, std::ios::binary);
      if (!in.is_open()) return true;
    }
    char buf[65536];
    while (true) {
      in.read(buf, sizeof(buf));
      std::streamsize n = in.gcount();
      if (n <= 0) break;
      partial.append(buf, size_t(n));
      size_t start = 0;
      for (size_t nl; (nl = partial.find('\n', start)) != std::string::npos; start = nl + 1)
        if (!sink(partial.substr(start, nl - start))) return false;
      partial.erase(0, start);
    }
    in.clear();  // clear EOF so that the next read sees appended data
    return true;
  };
  auto flush_partial = [&]() {
    if (!partial.empty()) sink(partial);
    partial.clear();
  };
  if (!drain()) return;
  if (!follow) return flush_partial();
  auto last_check = std::chrono::steady_clock::now();
  while (true) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (!drain()) return;
    if (std::chrono::steady_clock::now() - last_check < std::chrono::milliseconds(300)) continue;
    last_check = std::chrono::steady_clock::now();
    std::optional<TrainJobRecord> fresh = registry().find(name);
    if (!fresh) break;  // deleted while we followed
    reconcile(*fresh);
    const StepRecord* s = fresh->step(step_name);
    // The supervisor records a step's end only after relaying all its output, so one more drain
    // after seeing the end reads everything. A step that never started ends with its job.
    if (!s || is_terminal(s->status) || (is_terminal(fresh->status) && s->status == kCreated)) {
      if (!drain()) return;
      break;
    }
  }
  flush_partial();
}

void LocalBackend::delete_job(const std::string& name, bool remove_workspace) {
  std::optional<TrainJobRecord> job = registry().find(name);
  if (!job) throw Error("job " + name, "no TrainJob with this name (see `ktune jobs list`)");
  // The supervisor first (SIGKILL: it must start nothing more), then every step's process group.
  if (job->supervisor_pid > 0 && process_is_alive(job->supervisor_pid, job->supervisor_start_time)) {
    kill(job->supervisor_pid, SIGKILL);
    for (int i = 0; i < 500 && process_is_alive(job->supervisor_pid, job->supervisor_start_time); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // Read again: the supervisor may have started a step between our read and its death.
  if (auto fresh = registry().find(name)) job = std::move(*fresh);
  for (const StepRecord& s : job->steps)
    if (s.pid > 0) stop_process_group(s.pid, s.pid_start_time, config_.stop_grace_seconds);
  registry().remove(name);
  if (remove_workspace && !job->workspace.empty() && fs::path(job->workspace).filename() == name) {
    std::error_code ec;
    fs::remove_all(job->workspace, ec);
    check(!ec, job->workspace, "cannot remove the job's workspace: " + ec.message());
  }
}

}  // namespace ktune::sdk
