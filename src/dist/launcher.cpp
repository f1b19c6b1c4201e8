#include "dist/launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <thread>

#include "core/error.h"
#include "core/process_exit.h"
#include "dist/tcp_store.h"
#include "dist/worker_error.h"

namespace ktune::dist {

// ---- the worker's place ----------------------------------------------------------------------

static std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == 0) return std::nullopt;
  return std::string(v);
}

static int parse_count(const std::pair<std::string, std::string>& value, int minimum) {
  char* end = nullptr;
  long n = std::strtol(value.first.c_str(), &end, 10);
  if (value.first.empty() || *end != 0 || n < minimum || n > 1000000)
    throw Error(value.second, "expected an integer ≥ " + std::to_string(minimum) + ", got '" + value.first + "'");
  return int(n);
}

std::optional<WorkerEnv> read_worker_env() {
  auto rank = env("RANK");
  auto world = env("WORLD_SIZE");
  if (!rank || !world) return std::nullopt;
  WorkerEnv w;
  w.rank = parse_count({*rank, "env RANK"}, 0);
  w.world_size = parse_count({*world, "env WORLD_SIZE"}, 1);
  if (auto v = env("LOCAL_RANK")) w.local_rank = parse_count({*v, "env LOCAL_RANK"}, 0);
  if (auto v = env("LOCAL_WORLD_SIZE")) w.local_world_size = parse_count({*v, "env LOCAL_WORLD_SIZE"}, 1);
  if (auto v = env("GROUP_RANK")) w.node_rank = parse_count({*v, "env GROUP_RANK"}, 0);
  if (auto v = env("MASTER_ADDR")) w.master_addr = *v;
  if (auto v = env("MASTER_PORT")) w.master_port = parse_count({*v, "env MASTER_PORT"}, 1);
  if (auto v = env("KTUNE_COLLECTIVE_TIMEOUT"))
    w.collective_timeout = std::chrono::seconds(parse_count({*v, "env KTUNE_COLLECTIVE_TIMEOUT"}, 1));
  if (w.rank >= w.world_size) throw Error("env RANK", std::to_string(w.rank) + " is not below WORLD_SIZE " + *world);
  return w;
}

std::string local_address_towards(const std::string& peer) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(peer.c_str(), "9", &hints, &found) != 0 || found == nullptr) return "127.0.0.1";
  std::string result = "127.0.0.1";
  int fd = socket(found->ai_family, SOCK_DGRAM, 0);
  if (fd >= 0 && connect(fd, found->ai_addr, found->ai_addrlen) == 0) {  // UDP connect sends nothing
    sockaddr_storage local{};
    socklen_t len = sizeof local;
    char text[INET6_ADDRSTRLEN] = {0};
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      const void* addr = local.ss_family == AF_INET6 ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr)
                                                     : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr);
      if (inet_ntop(local.ss_family, addr, text, sizeof text)) result = text;
    }
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(found);
  return result;
}

// ---- supervising the workers ----------------------------------------------------------------

static std::atomic<int> g_signal{0};
static void on_signal(int sig) { g_signal = sig; }

struct Worker {
  int rank = 0;
  pid_t pid = -1;
  int out_fd = -1, err_fd = -1;  // read ends of the worker's stdout and stderr
  std::string out_partial, err_partial;
  std::string error_file;  // TORCHELASTIC_ERROR_FILE: where the worker writes why it failed
  bool exited = false;
  int status = 0;
  bool sent_sigterm = false, sent_sigkill = false;  // what this launcher sent it (a stop, or a forwarded signal)
};

// Whether the signal that ended a worker was this launcher's. A worker killed from outside (the OOM
// killer's SIGKILL) while the launcher was stopping the others on a peer's account is not: it only
// had a SIGTERM from us, or nothing yet.
// Nor is a worker's death of the SIGINT or SIGTERM the launcher itself got (`launcher_signal`, 0 if
// none): Ctrl-C in a terminal sends SIGINT to the whole process group, workers included, and they die
// of it before the launcher forwards anything; the interrupt, not a rank, ended the job.
static bool ended_by_our_signal(const Worker& w, int status, int launcher_signal) {
  if (!WIFSIGNALED(status)) return false;
  if (launcher_signal != 0 && WTERMSIG(status) == launcher_signal) return true;
  return (WTERMSIG(status) == SIGTERM && w.sent_sigterm) || (WTERMSIG(status) == SIGKILL && w.sent_sigkill);
}

static bool failed(int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 0); }

// Prints whole lines of `chunk` with the rank prefix; keeps an unfinished line in `partial`.
static void forward_lines(std::FILE* out, int rank, std::string& partial, const char* chunk, size_t n) {
  partial.append(chunk, n);
  size_t start = 0;
  for (size_t nl; (nl = partial.find('\n', start)) != std::string::npos; start = nl + 1)
    std::fprintf(out, "[rank%d]: %.*s\n", rank, int(nl - start), partial.data() + start);
  partial.erase(0, start);
  std::fflush(out);
}

static void drain(Worker& w, int& fd, std::string& partial, std::FILE* out) {
  char buffer[65536];
  ssize_t n = read(fd, buffer, sizeof buffer);
  if (n > 0) {
    forward_lines(out, w.rank, partial, buffer, size_t(n));
  } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
    if (!partial.empty()) forward_lines(out, w.rank, partial, "\n", 1);
    close(fd);
    fd = -1;
  }
}

static pid_t spawn_worker(const LaunchPlan& plan, int local_rank, const std::vector<std::string>& argv, Worker& w) {
  int out_pipe[2], err_pipe[2];
  if (pipe(out_pipe) != 0 || pipe(err_pipe) != 0) throw Error("launcher", std::string("pipe: ") + std::strerror(errno));
  pid_t pid = fork();
  if (pid < 0) throw Error("launcher", std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    dup2(out_pipe[1], STDOUT_FILENO);
    dup2(err_pipe[1], STDERR_FILENO);
    close(out_pipe[0]); close(out_pipe[1]); close(err_pipe[0]); close(err_pipe[1]);
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) signal(sig, SIG_DFL);
    // A launcher that dies without stopping it (SIGKILL, a crash) still takes the worker with it.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    int rank = plan.node_rank * plan.nproc_per_node + local_rank;
    setenv("RANK", std::to_string(rank).c_str(), 1);
    setenv("LOCAL_RANK", std::to_string(local_rank).c_str(), 1);
    setenv("WORLD_SIZE", std::to_string(plan.world_size()).c_str(), 1);
    setenv("LOCAL_WORLD_SIZE", std::to_string(plan.nproc_per_node).c_str(), 1);
    setenv("GROUP_RANK", std::to_string(plan.node_rank).c_str(), 1);
    setenv("MASTER_ADDR", plan.master_addr.c_str(), 1);
    setenv("MASTER_PORT", std::to_string(plan.master_port).c_str(), 1);
    setenv("TORCHELASTIC_RUN_ID", plan.rdzv_id.c_str(), 1);
    setenv("TORCHELASTIC_ERROR_FILE", w.error_file.c_str(), 1);
    // Share this node's cores among its workers, unless the user chose.
    if (std::getenv("KTUNE_NUM_THREADS") == nullptr) {
      long cpus = sysconf(_SC_NPROCESSORS_ONLN);
      setenv("KTUNE_NUM_THREADS", std::to_string(std::max<long>(1, cpus / plan.nproc_per_node)).c_str(), 1);
    }
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    std::fprintf(stderr, "cannot execute %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  w.out_fd = out_pipe[0];
  w.err_fd = err_pipe[0];
  w.pid = pid;
  return pid;
}

// One worker's failure as the launchers share it through the store: "<time_ns> <why>".
struct Failure {
  int64_t time_ns = 0;
  bool lost_peer = false;  // a collective's failure for want of a peer: a consequence (WorkerError)
  std::string why;
};
// "<time_ns> <0|1> <why>", through the store to node 0.
static std::string encode_failure(const Failure& f) {
  return std::to_string(f.time_ns) + " " + (f.lost_peer ? "1" : "0") + " " + f.why;
}
static Failure decode_failure(const std::string& text) {
  const size_t first = text.find(' ');
  const size_t second = first == std::string::npos ? std::string::npos : text.find(' ', first + 1);
  if (second == std::string::npos) return {0, false, text};
  try {
    return {std::stoll(text.substr(0, first)), text.substr(first + 1, second - first - 1) == "1", text.substr(second + 1)};
  } catch (const std::exception&) {
    return {0, false, text};
  }
}

static void signal_all(std::vector<Worker>& workers, int sig) {
  for (Worker& w : workers) {
    if (w.exited) continue;
    // Marked before the kill: a worker reaped after it must not be taken for one killed from outside.
    if (sig == SIGTERM) w.sent_sigterm = true;
    if (sig == SIGKILL) w.sent_sigkill = true;
    kill(w.pid, sig);
  }
}

int run_launcher(const LaunchPlan& requested, const std::vector<std::string>& worker_argv) {
  check(!worker_argv.empty(), "launcher", "no worker command");
  check(requested.node_rank == 0 || requested.master_port != 0, "launcher", "only node 0 can take a free port");
  // Node 0 serves the store; every node's launcher is a client of it. Port 0: the one it got.
  LaunchPlan plan = requested;
  std::unique_ptr<TcpStoreServer> server;
  if (plan.node_rank == 0) {
    server = std::make_unique<TcpStoreServer>(plan.master_port);
    plan.master_port = server->port();
  }
  std::string store_host = plan.node_rank == 0 ? "127.0.0.1" : plan.master_addr;
  TcpStore store(store_host, plan.master_port, plan.rdzv_timeout);

  const std::string me = "node" + std::to_string(plan.node_rank);
  store.set("ktune/rdzv/" + me, local_address_towards(plan.master_addr));
  std::vector<std::string> nodes;
  for (int i = 0; i < plan.nnodes; ++i) nodes.push_back("ktune/rdzv/node" + std::to_string(i));
  try {
    store.wait(nodes, plan.rdzv_timeout);
  } catch (const Error& e) {
    std::string missing;
    for (int i = 0; i < plan.nnodes; ++i)
      if (!store.check(nodes[size_t(i)])) missing += " " + std::to_string(i);
    throw Error("rendezvous at " + plan.master_addr + ":" + std::to_string(plan.master_port),
                "timed out after " + std::to_string(plan.rdzv_timeout.count() / 1000) + " s; nodes that never joined:" + missing);
  }

  // The signals torchrun stops its workers on (TORCHELASTIC_SIGNALS_TO_HANDLE): a closed terminal or
  // a dropped SSH session (SIGHUP) ends the job as Ctrl-C does.
  struct sigaction action {};
  action.sa_handler = on_signal;
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) sigaction(sig, &action, nullptr);

  // Each worker's error file lives in a directory of this launch, removed at the end.
  std::string tmp_root = env("TMPDIR").value_or("/tmp");
  std::string error_dir_template = tmp_root + "/ktune-launch-XXXXXX";
  std::vector<char> error_dir(error_dir_template.begin(), error_dir_template.end());
  error_dir.push_back(0);
  if (mkdtemp(error_dir.data()) == nullptr) throw Error("launcher", "cannot create a directory under " + tmp_root + ": " + std::strerror(errno));

  std::vector<Worker> workers(size_t(plan.nproc_per_node));
  for (int local = 0; local < plan.nproc_per_node; ++local) {
    Worker& w = workers[size_t(local)];
    w.rank = plan.node_rank * plan.nproc_per_node + local;
    w.error_file = std::string(error_dir.data()) + "/error_rank" + std::to_string(w.rank) + ".json";
    spawn_worker(plan, local, worker_argv, w);
  }

  std::string failure;                     // why this node stopped its workers
  int interrupted_by = 0;                  // the SIGINT or SIGTERM this launcher got, 0 while none
  std::vector<Failure> local_failures;  // this node's workers that failed by themselves
  bool stopping = false;
  auto stop_deadline = std::chrono::steady_clock::time_point::max();
  auto last_store_check = std::chrono::steady_clock::now();
  auto begin_stop = [&](const std::string& why) {
    if (failure.empty()) failure = why;
    if (stopping) return;
    stopping = true;
    signal_all(workers, SIGTERM);
    stop_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  };

  for (;;) {
    std::vector<pollfd> fds;
    std::vector<std::pair<Worker*, bool>> owners;  // (worker, is_stderr)
    for (Worker& w : workers) {
      if (w.out_fd >= 0) { fds.push_back({w.out_fd, POLLIN, 0}); owners.push_back({&w, false}); }
      if (w.err_fd >= 0) { fds.push_back({w.err_fd, POLLIN, 0}); owners.push_back({&w, true}); }
    }
    bool all_exited = true;
    for (Worker& w : workers) all_exited = all_exited && w.exited;
    if (all_exited && fds.empty()) break;

    if (!fds.empty() && poll(fds.data(), fds.size(), 200) > 0) {
      for (size_t i = 0; i < fds.size(); ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        Worker& w = *owners[i].first;
        if (owners[i].second) drain(w, w.err_fd, w.err_partial, stderr);
        else drain(w, w.out_fd, w.out_partial, stdout);
      }
    } else if (fds.empty()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }

    for (Worker& w : workers) {
      if (w.exited) continue;
      int status = 0;
      struct rusage usage {};
      if (wait4(w.pid, &status, WNOHANG, &usage) == w.pid) {
        w.exited = true;
        w.status = status;
        // A signal to the process group reaches this launcher as it reaches the workers, so its
        // handler has run (g_signal) before a worker's death of it can be reaped.
        const int launcher_signal = interrupted_by != 0 ? interrupted_by : g_signal.load();
        bool stopped_by_us = ended_by_our_signal(w, status, launcher_signal);
        // A worker that wrote an error file failed by itself, even if our SIGTERM met it on its way out.
        std::optional<WorkerError> error = read_worker_error(w.error_file);
        if ((failed(status) && !stopped_by_us) || error) {
          Failure f{error ? error->time_ns : wall_clock_ns(), error && error->lost_peer,
                    "rank " + std::to_string(w.rank) + " (" + me + ", pid " + std::to_string(w.pid) + ") " +
                        describe_process_exit(status, &usage, stopped_by_us) +
                        (error ? ": " + error->message : std::string())};
          try {
            int64_t index = store.add("ktune/failures", 1);
            store.set("ktune/failure/" + std::to_string(index), encode_failure(f));
          } catch (const Error&) {
          }
          local_failures.push_back(f);
          begin_stop(f.why);
        }
      }
    }

    if (int sig = g_signal.exchange(0)) {
      interrupted_by = sig;
      signal_all(workers, sig == SIGQUIT ? SIGTERM : sig);  // (SIGQUIT's default would dump every worker's core)
      if (failure.empty()) failure = std::string("interrupted by ") + strsignal(sig);
      stopping = true;
      stop_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    }
    if (stopping && std::chrono::steady_clock::now() > stop_deadline) {
      signal_all(workers, SIGKILL);
      stop_deadline = std::chrono::steady_clock::time_point::max();
    }
    if (plan.nnodes > 1 && !stopping && std::chrono::steady_clock::now() - last_store_check > std::chrono::milliseconds(500)) {
      last_store_check = std::chrono::steady_clock::now();
      try {
        if (store.check("ktune/failure/1")) begin_stop(decode_failure(store.get_string("ktune/failure/1")).why);
      } catch (const Error& e) {
        begin_stop(std::string("lost contact with the rendezvous store on node 0: ") + e.what_only());
      }
    }
  }

  bool any_failed = false;
  for (const Worker& w : workers) any_failed = any_failed || failed(w.status);
  if (interrupted_by != 0 && local_failures.empty()) any_failed = true;  // stopped, not finished
  // Tell node 0 this node is done; node 0 keeps the store up until every node has said so.
  try {
    store.set("ktune/done/" + me, std::string(any_failed ? "failed" : "ok"));
    if (plan.node_rank == 0 && plan.nnodes > 1) {
      std::vector<std::string> done;
      for (int i = 0; i < plan.nnodes; ++i) done.push_back("ktune/done/node" + std::to_string(i));
      store.wait(done, any_failed || !failure.empty() ? std::chrono::milliseconds(10000) : plan.rdzv_timeout);
    }
  } catch (const Error&) {
    // A node that died never says done; the failure (if any) is reported below.
  }
  std::error_code ignored;
  std::filesystem::remove_all(error_dir.data(), ignored);  // error files, and any a kill cut short
  if (any_failed || !failure.empty()) {
    // Every failure the store knows of: the causes first (a worker's own error, or its death, which
    // it could not time: the launcher's reap stands for it), then the peers that lost one in a
    // collective (PeerLostError); each group the earliest first.
    std::vector<Failure> all;
    try {
      for (int64_t i = 1, n = store.add("ktune/failures", 0); i <= n; ++i) all.push_back(decode_failure(store.get_string("ktune/failure/" + std::to_string(i))));
    } catch (const Error&) {
      all = local_failures;
    }
    std::stable_sort(all.begin(), all.end(), [](const Failure& a, const Failure& b) {
      return a.lost_peer != b.lost_peer ? !a.lost_peer : a.time_ns < b.time_ns;
    });
    if (all.empty() && interrupted_by != 0) {  // nothing failed by itself: the interrupt ended the job
      std::fprintf(stderr, "ktune launcher (%s): %s; stopped the workers\n", me.c_str(), failure.c_str());
      return 128 + interrupted_by;  // as a shell reports a process ended by that signal
    }
    std::string message;
    if (all.empty()) message = failure.empty() ? std::string("a worker failed") : failure;
    for (size_t i = 0; i < all.size(); ++i) message += (i == 0 ? "" : i == 1 ? "; after it: " : "; ") + all[i].why;
    if (!all.empty() && all.front().lost_peer)
      message += " (each of these lost a peer in a collective: the rank that failed first was stopped, or its node "
                 "lost, before it could say why)";
    std::fprintf(stderr, "ktune launcher (%s): job failed: %s; stopped the other workers\n", me.c_str(), message.c_str());
    return 1;
  }
  return 0;
}

}  // namespace ktune::dist
