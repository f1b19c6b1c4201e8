// The launcher: torchrun's semantics inside `ktune run`. From a LaunchPlan (launch_plan.h: the
// launcher options and their PET_* env, read there and only there) it meets the other nodes
// through a TCP store served by node 0, spawns this node's workers with RANK, LOCAL_RANK,
// WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT, prefixes their output with their rank, forwards
// SIGINT/SIGTERM, and if any worker anywhere fails, stops every worker on every node and exits
// non-zero saying which rank failed and why.
// It deliberately knows nothing of recipes: it re-executes a given command line as each worker.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "dist/launch_plan.h"

namespace ktune::dist {

// Spawns the node's workers, each running worker_argv (argv[0] is the executable), and supervises
// them until all exit. With plan.master_port 0 (--standalone), node 0's store takes a free port
// and the workers are told that one. Returns 0 when every worker on every node succeeded, else
// non-zero after printing which rank failed and why.
int run_launcher(const LaunchPlan& plan, const std::vector<std::string>& worker_argv);

// What a worker knows of its place, from the env the launcher set. Absent outside a launch.
struct WorkerEnv {
  int rank = 0, local_rank = 0, world_size = 1, local_world_size = 1, node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  // How long a collective of the run's groups (Gloo's and the GPUs' NCCL one) waits for its peers
  // before it ends in a timeout error: env KTUNE_COLLECTIVE_TIMEOUT (seconds), else 30 minutes,
  // torch.distributed's Gloo default. It bounds the wait of the ranks that reach the barrier after a
  // checkpoint while rank 0 still writes it (at 70B, hundreds of GB), so it is long; a crashed
  // worker does not wait on it (the launcher stops the others when one exits in error).
  std::chrono::milliseconds collective_timeout = std::chrono::minutes(30);
};
std::optional<WorkerEnv> read_worker_env();

// The local address this host uses to reach `peer` (for Gloo: what other nodes connect to).
std::string local_address_towards(const std::string& peer);

}  // namespace ktune::dist
