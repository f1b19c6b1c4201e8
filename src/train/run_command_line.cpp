// Parsing `ktune run [launcher args] RECIPE --config X overrides…`. See run_command_line.h.
#include "train/run_command_line.h"

#include <charconv>
#include <cstdlib>

#include "core/error.h"
#include "train/config_suggest.h"

namespace ktune::train {

namespace {

struct LauncherOption {
  const char* name;  // canonical, underscore spelling, without "--"
  const char* env;   // torchrun's PET_* variable
  bool is_flag;      // takes no value
};

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

std::string underscored(std::string s) {
  for (char& c : s)
    if (c == '-') c = '_';
  return s;
}

bool parse_int(const std::string& s, int& out) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return !s.empty() && ec == std::errc() && p == s.data() + s.size();
}

bool truthy(const std::string& s) { return !(s.empty() || s == "0" || s == "false" || s == "False"); }

class Parser {
 public:
  Parser(const std::vector<std::string>& args, const EnvLookup& env) : args_(args), env_(env) {}

  RunCommandLine run() {
    // Environment first, so the command line overrides it.
    for (const LauncherOption& o : launcher_options())
      if (auto value = env_(o.env)) set_option(o, *value, o.env);

    std::size_t i = 0;
    for (; i < args_.size(); ++i) {
      const std::string& a = args_[i];
      if (a.rfind("--", 0) != 0) break;
      std::string body = a.substr(2);
      std::size_t eq = body.find('=');
      std::string name = underscored(body.substr(0, eq));
      const LauncherOption* option = nullptr;
      for (const LauncherOption& o : launcher_options())
        if (name == o.name) option = &o;
      if (option == nullptr) {
        if (name == "config") {
          error("--config", "comes after the recipe: ktune run [launcher args] RECIPE --config NAME");
          if (eq == std::string::npos) ++i;
          continue;
        }
        std::vector<std::string> known;
        for (const LauncherOption& o : launcher_options()) known.push_back(std::string("--") + o.name);
        error(a, "unknown launcher option" + did_you_mean("--" + name, known));
        continue;
      }
      std::string value;
      if (option->is_flag) {
        value = eq == std::string::npos ? "1" : body.substr(eq + 1);
      } else if (eq != std::string::npos) {
        value = body.substr(eq + 1);
      } else if (i + 1 < args_.size()) {
        value = args_[++i];
      } else {
        error(a, "needs a value");
        continue;
      }
      set_option(*option, value, a);
    }

    if (i < args_.size()) {
      out_.recipe = args_[i++];
      if (out_.recipe.size() > 3 && out_.recipe.compare(out_.recipe.size() - 3, 3, ".py") == 0)
        error("recipe " + out_.recipe, "ktune's recipes are native (full_finetune_single_device, "
                                       "full_finetune_distributed, lora_finetune_single_device, "
                                       "lora_finetune_distributed); a Python recipe file cannot run");
    } else {
      error("ktune run", "missing RECIPE: ktune run [launcher args] RECIPE --config NAME|FILE [key=value ...]");
    }

    bool have_config = false;
    for (; i < args_.size(); ++i) {
      const std::string& a = args_[i];
      if (a == "--config" || a.rfind("--config=", 0) == 0) {
        std::string value;
        if (a == "--config") {
          if (i + 1 >= args_.size()) {
            error("--config", "needs a config name or a YAML file");
            continue;
          }
          value = args_[++i];
        } else {
          value = a.substr(9);
        }
        if (have_config) error("--config " + value, "given twice (first: " + out_.config + ")");
        out_.config = value;
        have_config = true;
      } else if (a.rfind("--", 0) == 0) {
        error(a, "additional flag arguments are not supported after the recipe: use --config and key=value "
                 "overrides (launcher options go before the recipe)");
      } else {
        out_.overrides.push_back(a);
      }
    }
    if (!have_config && !out_.recipe.empty()) error("ktune run " + out_.recipe, "--config NAME|FILE is required");

    const LauncherArgs& l = out_.launcher;
    if (l.node_rank >= l.nnodes_max) error("--node_rank", "node rank " + std::to_string(l.node_rank) +
                                                              " is not below --nnodes " + std::to_string(l.nnodes_max));
    if (!errors_.empty()) throw Errors(std::move(errors_));
    return out_;
  }

 private:
  void error(const std::string& where, const std::string& what) { errors_.emplace_back(where, what); }

  void set_option(const LauncherOption& o, const std::string& value, const std::string& where) {
    LauncherArgs& l = out_.launcher;
    std::string name = o.name;
    bool ok = true;
    if (name == "nnodes") {
      std::size_t colon = value.find(':');
      int lo = 0, hi = 0;
      if (colon == std::string::npos) {
        ok = parse_int(value, lo) && lo >= 1;
        hi = lo;
      } else {
        ok = parse_int(value.substr(0, colon), lo) && parse_int(value.substr(colon + 1), hi) && lo >= 1 && hi >= lo;
      }
      if (ok) {
        l.nnodes_min = lo;
        l.nnodes_max = hi;
      } else {
        error(where, "expected a node count N >= 1 or MIN:MAX, got `" + value + "`");
      }
    } else if (name == "nproc_per_node") {
      int n = 0;
      ok = value == "auto" || value == "cpu" || value == "gpu" || (parse_int(value, n) && n >= 1);
      if (ok)
        l.nproc_per_node = value;
      else
        error(where, "expected a process count >= 1, auto, cpu or gpu, got `" + value + "`");
    } else if (name == "node_rank") {
      int rank = 0;
      ok = parse_int(value, rank) && rank >= 0;
      if (ok)
        l.node_rank = rank;
      else
        error(where, "expected a node rank >= 0, got `" + value + "`");
    } else if (name == "master_port") {
      int port = 0;
      ok = parse_int(value, port) && port >= 1 && port <= 65535;
      if (ok)
        l.master_port = port;
      else
        error(where, "expected a port in 1..65535, got `" + value + "`");
    } else if (name == "rdzv_endpoint") {
      std::size_t colon = value.rfind(':');
      int port = 0;
      ok = !value.empty() && (colon == std::string::npos ||
                              (colon > 0 && parse_int(value.substr(colon + 1), port) && port >= 1 && port <= 65535));
      if (ok)
        l.rdzv_endpoint = value;
      else
        error(where, "expected HOST[:PORT], got `" + value + "`");
    } else if (name == "rdzv_backend") {
      l.rdzv_backend = value;
    } else if (name == "rdzv_id") {
      l.rdzv_id = value;
    } else if (name == "master_addr") {
      ok = !value.empty();
      if (ok)
        l.master_addr = value;
      else
        error(where, "expected a host name or address");
    } else if (name == "standalone") {
      l.standalone = truthy(value);
    }
    if (ok) {
      for (const std::string& g : l.given)
        if (g == name) return;
      l.given.push_back(name);
    }
  }

  const std::vector<std::string>& args_;
  const EnvLookup& env_;
  RunCommandLine out_;
  std::vector<Error> errors_;
};

}  // namespace

std::optional<int> LauncherArgs::nproc_count() const {
  int n = 0;
  if (parse_int(nproc_per_node, n)) return n;
  return std::nullopt;
}

bool RunCommandLine::distributed_launch() const {
  const LauncherArgs& l = launcher;
  std::optional<int> nproc = l.nproc_count();
  return l.nnodes_max > 1 || !nproc || *nproc > 1 || !l.rdzv_endpoint.empty() || l.standalone;
}

EnvLookup process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    if (const char* v = std::getenv(name.c_str())) return std::string(v);
    return std::nullopt;
  };
}

RunCommandLine parse_run_command_line(const std::vector<std::string>& args, const EnvLookup& env) {
  return Parser(args, env).run();
}

}  // namespace ktune::train
