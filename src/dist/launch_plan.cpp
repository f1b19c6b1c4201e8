// Resolving torchrun's launcher options into a LaunchPlan. See launch_plan.h for the rules.
#include "dist/launch_plan.h"

#include <dirent.h>
#include <unistd.h>

#include <charconv>
#include <cstdlib>

#include "dist/tcp_store.h"

namespace ktune::dist {

namespace {

// A value and where it came from: the flag argument ("--nnodes=2") or the variable ("env PET_NNODES").
struct Value {
  std::string text;
  std::string where;
};

bool parse_int(const std::string& s, int& out) {
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return !s.empty() && ec == std::errc() && end == s.data() + s.size();
}

bool truthy(const std::string& s) { return !(s.empty() || s == "0" || s == "false" || s == "False"); }

std::string underscored(std::string s) {
  for (char& c : s)
    if (c == '-') c = '_';
  return s;
}

int cpus_on_this_node() {
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  return cpus > 0 ? int(cpus) : 1;
}

// Reads each option once: the flag, else its PET_* variable (an empty one counts as unset).
class PlanResolver {
 public:
  PlanResolver(const LauncherArgs& args, const EnvLookup& env, std::vector<Error>& errors)
      : args_(args), env_(env), errors_(errors) {}

  LaunchPlan run() {
    std::size_t errors_before = errors_.size();
    std::optional<Value> nnodes = read_nnodes();
    bool nnodes_ok = errors_.size() == errors_before;
    read_nproc_per_node();
    read_node_rank(nnodes, nnodes_ok);
    read_rendezvous_address();
    read_rendezvous_backend();
    read_standalone(nnodes);
    // As torchtune's `tune run`: one node given no --rdzv_endpoint takes a free port for its store,
    // as --standalone does, so that several jobs run side by side; a --master_port (or
    // PET_MASTER_PORT) given is kept.
    if (plan_.nnodes == 1 && plan_.rdzv_endpoint.empty() && !value("master_port")) plan_.master_port = 0;
    if (auto v = env_("KTUNE_RDZV_TIMEOUT"); v && !v->empty()) {
      int seconds = 0;
      if (parse_int(*v, seconds) && seconds >= 1)
        plan_.rdzv_timeout = std::chrono::seconds(seconds);
      else
        error("env KTUNE_RDZV_TIMEOUT", "expected a number of seconds >= 1, got `" + *v + "`");
    }
    return plan_;
  }

 private:
  void error(const std::string& where, const std::string& what) { errors_.emplace_back(where, what); }

  std::optional<Value> value(const char* name) const {
    const LauncherOption& option = *find_launcher_option(name);
    if (auto it = args_.find(name); it != args_.end()) return Value{it->second.value, it->second.where};
    if (auto v = env_(option.env); v && !v->empty()) return Value{*v, std::string("env ") + option.env};
    return std::nullopt;
  }

  std::optional<Value> read_nnodes() {
    std::optional<Value> v = value("nnodes");
    if (!v) return v;
    const std::string& t = v->text;
    std::size_t colon = t.find(':');
    int lo = 0, hi = 0;
    bool ok = colon == std::string::npos ? parse_int(t, lo) && parse_int(t, hi)
                                         : parse_int(t.substr(0, colon), lo) && parse_int(t.substr(colon + 1), hi);
    if (!ok || lo < 1 || hi < lo) {
      error(v->where, "expected a node count N >= 1 (or N:N), got `" + t + "`");
    } else if (lo < hi) {
      std::string kubeflow = v->where == "env PET_NNODES"
                                 ? " (Kubeflow Trainer sets PET_NNODES to MIN:MAX for a runtime with "
                                   "mlPolicy.torch.elasticPolicy; give it numNodes instead)"
                                 : "";
      error(v->where, "`" + t + "` is an elastic range (MIN:MAX); elastic node ranges are not supported: ktune "
                      "runs a fixed number of nodes, so give one count, N or N:N" + kubeflow);
    } else {
      plan_.nnodes = lo;
    }
    return v;
  }

  void read_nproc_per_node() {
    std::optional<Value> v = value("nproc_per_node");
    if (!v) return;
    const std::string& t = v->text;
    int n = 0;
    if (t == "auto") {
      plan_.nproc_per_node = auto_nproc_per_node();
    } else if (t == "cpu") {
      plan_.nproc_per_node = cpus_on_this_node();
    } else if (t == "gpu") {
      if (int gpus = gpus_on_this_node(); gpus > 0)
        plan_.nproc_per_node = gpus;
      else
        error(v->where, "is gpu, but this node has no NVIDIA GPU (/proc/driver/nvidia/gpus is empty)");
    } else if (parse_int(t, n) && n >= 1) {
      plan_.nproc_per_node = n;
    } else {
      error(v->where, "expected a process count >= 1, auto, cpu or gpu, got `" + t + "`");
    }
  }

  // nnodes_ok: the node count was read without error, so the rank can be checked against it.
  void read_node_rank(const std::optional<Value>& nnodes, bool nnodes_ok) {
    std::optional<Value> v = value("node_rank");
    if (!v) return;
    int rank = 0;
    if (!parse_int(v->text, rank) || rank < 0) {
      error(v->where, "expected a node rank >= 0, got `" + v->text + "`");
      return;
    }
    plan_.node_rank = rank;
    if (nnodes_ok && rank >= plan_.nnodes) {
      std::string source = nnodes && nnodes->where.rfind("env ", 0) == 0 ? " (" + nnodes->where + ")" : "";
      error(v->where, "node rank " + std::to_string(rank) + " is not below --nnodes " + std::to_string(plan_.nnodes) + source);
    }
  }

  // --rdzv_endpoint when given, else --master_addr and --master_port.
  void read_rendezvous_address() {
    if (auto v = value("master_addr")) plan_.master_addr = v->text;
    if (auto v = value("master_port")) {
      int port = 0;
      if (parse_int(v->text, port) && port >= 1 && port <= 65535)
        plan_.master_port = port;
      else
        error(v->where, "expected a port in 1..65535, got `" + v->text + "`");
    }
    if (auto v = value("rdzv_endpoint")) {
      try {
        auto [host, port] = parse_endpoint(v->text, 29500);
        if (host.empty()) throw Error("no host");
        plan_.rdzv_endpoint = v->text;
        plan_.master_addr = host;
        plan_.master_port = port;
      } catch (const Error&) {
        error(v->where, "expected HOST[:PORT] with a port in 1..65535, got `" + v->text + "`");
      }
    }
    if (auto it = args_.find("master_addr"); it != args_.end() && it->second.value.empty())
      error(it->second.where, "expected a host name or address");
  }

  void read_rendezvous_backend() {
    if (auto v = value("rdzv_backend")) {
      if (v->text == "static" || v->text == "c10d")
        plan_.rdzv_backend = v->text;
      else
        error(v->where, "ktune's rendezvous is a TCP store on node 0: rdzv_backend static or c10d, got `" + v->text + "`");
    }
    if (auto v = value("rdzv_id")) plan_.rdzv_id = v->text;
  }

  void read_standalone(const std::optional<Value>& nnodes) {
    std::optional<Value> v = value("standalone");
    if (!v || !truthy(v->text)) return;
    plan_.standalone = true;
    if (plan_.nnodes != 1)
      error(v->where, "means one node, but " + nnodes->where + " gives " + std::to_string(plan_.nnodes));
    plan_.master_addr = "127.0.0.1";
    plan_.master_port = 0;
  }

  const LauncherArgs& args_;
  const EnvLookup& env_;
  std::vector<Error>& errors_;
  LaunchPlan plan_;
};

}  // namespace

EnvLookup process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    if (const char* v = std::getenv(name.c_str())) return std::string(v);
    return std::nullopt;
  };
}

EnvLookup environment_of(std::map<std::string, std::string> variables) {
  return [variables = std::move(variables)](const std::string& name) -> std::optional<std::string> {
    auto it = variables.find(name);
    if (it == variables.end()) return std::nullopt;
    return it->second;
  };
}

const std::vector<LauncherOption>& launcher_options() {
  static const std::vector<LauncherOption> options = {
      {"nnodes", "PET_NNODES", false},
      {"nproc_per_node", "PET_NPROC_PER_NODE", false},
      {"node_rank", "PET_NODE_RANK", false},
      {"rdzv_endpoint", "PET_RDZV_ENDPOINT", false},
      {"rdzv_backend", "PET_RDZV_BACKEND", false},
      {"rdzv_id", "PET_RDZV_ID", false},
      {"master_addr", "PET_MASTER_ADDR", false},
      {"master_port", "PET_MASTER_PORT", false},
      {"standalone", "PET_STANDALONE", true},
  };
  return options;
}

const LauncherOption* find_launcher_option(const std::string& name) {
  std::string canonical = underscored(name);
  for (const LauncherOption& o : launcher_options())
    if (canonical == o.name) return &o;
  return nullptr;
}

LaunchPlan resolve_launch_plan(const LauncherArgs& args, const EnvLookup& env, std::vector<Error>& errors) {
  return PlanResolver(args, env, errors).run();
}

LaunchPlan resolve_launch_plan(const LauncherArgs& args, const EnvLookup& env) {
  std::vector<Error> errors;
  LaunchPlan plan = resolve_launch_plan(args, env, errors);
  if (!errors.empty()) throw Errors(std::move(errors));
  return plan;
}

int gpus_on_this_node() {
  int count = 0;
  if (DIR* dir = opendir("/proc/driver/nvidia/gpus")) {
    while (dirent* e = readdir(dir))
      if (e->d_name[0] != '.') ++count;
    closedir(dir);
  }
  return count;
}

int auto_nproc_per_node() {
  int gpus = gpus_on_this_node();
  return gpus > 0 ? gpus : cpus_on_this_node();
}

}  // namespace ktune::dist
