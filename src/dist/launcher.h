// The launcher: torchrun's semantics inside `ktune run`. It reads the launcher arguments
// (--nnodes, --nproc_per_node, --node_rank, --rdzv_endpoint or --master_addr/--master_port) and
// their env equivalents (PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR,
// PET_MASTER_PORT, as the Kubeflow controller sets them), meets the other nodes through a TCP store
// served by node 0, spawns this node's workers with RANK, LOCAL_RANK, WORLD_SIZE,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, prefixes their output with their rank, forwards
// SIGINT/SIGTERM, and if any worker anywhere fails, stops every worker on every node and exits
// non-zero saying which rank failed and why.
// It deliberately knows nothing of recipes: it re-executes a given command line as each worker.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace ktune::dist {

// The launcher arguments as given on the command line (unset = take the env, then the default).
struct LauncherArgs {
  std::optional<std::string> nnodes;          // "2" (ranges like "1:2" are not supported: elastic)
  std::optional<std::string> nproc_per_node;  // "4", "auto", "cpu", "gpu"
  std::optional<std::string> node_rank;
  std::optional<std::string> rdzv_endpoint;   // "host:port"
  std::optional<std::string> master_addr;
  std::optional<std::string> master_port;
  bool standalone = false;                    // --standalone: one node, a free local port
};

struct LaunchPlan {
  int nnodes = 1;
  int nproc_per_node = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::chrono::milliseconds rdzv_timeout{std::chrono::seconds(300)};  // env KTUNE_RDZV_TIMEOUT (seconds)

  int world_size() const { return nnodes * nproc_per_node; }
};

// Resolves arguments, then env (PET_* and torchrun's own names), then defaults. Errors name the
// argument or variable at fault.
LaunchPlan resolve_launch_plan(const LauncherArgs& args);

// Number of GPUs (NVIDIA devices under /proc/driver/nvidia/gpus) or, without any, CPU cores —
// what "auto" means, like the Kubeflow controller and torchrun.
int auto_nproc_per_node();

// Spawns the node's workers, each running worker_argv (argv[0] is the executable), and supervises
// them until all exit. Returns 0 when every worker on every node succeeded, else non-zero after
// printing which rank failed and why.
int run_launcher(const LaunchPlan& plan, const std::vector<std::string>& worker_argv);

// What a worker knows of its place, from the env the launcher set. Absent outside a launch.
struct WorkerEnv {
  int rank = 0, local_rank = 0, world_size = 1, local_world_size = 1, node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
};
std::optional<WorkerEnv> read_worker_env();

// The local address this host uses to reach `peer` (for Gloo: what other nodes connect to).
std::string local_address_towards(const std::string& peer);

}  // namespace ktune::dist
