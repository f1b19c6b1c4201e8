// The command line of `ktune run` (torchtune's `tune run`), parsed into its three parts:
//   ktune run [launcher args] RECIPE --config NAME|FILE [key=value | ~key ...]
// Launcher args are torchrun's and come before the recipe, in either spelling (underscore or dash)
// and either form (--nnodes=2 or --nnodes 2): --nnodes, --nproc_per_node, --node_rank,
// --rdzv_endpoint, --rdzv_backend, --rdzv_id, --master_addr, --master_port, --standalone.
// Each also reads its PET_* environment variable as torchrun does (PET_NNODES, PET_NPROC_PER_NODE,
// PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT, PET_RDZV_ENDPOINT, …); the command line wins.
// After the recipe, --config may come anywhere among the overrides; other --flags are refused,
// as torchtune refuses them. Every problem is reported together (ktune::Errors).
// It parses only: starting processes is the launcher's job, the config is config_*.h's.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace ktune::train {

struct LauncherArgs {
  int nnodes_min = 1;  // --nnodes N, or MIN:MAX (elastic)
  int nnodes_max = 1;
  std::string nproc_per_node = "1";  // an int, or torchrun's auto | cpu | gpu
  int node_rank = 0;
  std::string rdzv_endpoint;  // host[:port], "" when unset
  std::string rdzv_backend = "static";
  std::string rdzv_id = "none";
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  bool standalone = false;
  std::vector<std::string> given;  // the launcher options that were set (flag or PET_*), by canonical name

  // --nproc_per_node as a count, or nullopt for auto/cpu/gpu (the launcher resolves those).
  std::optional<int> nproc_count() const;
};

struct RunCommandLine {
  LauncherArgs launcher;
  std::string recipe;
  std::string config;
  std::vector<std::string> overrides;  // key=value and ~key, in order

  // Whether the run needs the multi-process launcher: more than one node or process, or
  // rendezvous options given (torchtune launches through torchrun exactly then).
  bool distributed_launch() const;
};

// A lookup of environment variables (tests pass a map; the CLI passes getenv).
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;
EnvLookup process_environment();

// args: what follows `run` on the command line.
RunCommandLine parse_run_command_line(const std::vector<std::string>& args,
                                      const EnvLookup& env = process_environment());

}  // namespace ktune::train
