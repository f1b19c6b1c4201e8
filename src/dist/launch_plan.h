// torchrun's launcher options, turned into the plan of one node's launch. The single place where
// --nnodes, --nproc_per_node, --node_rank, --rdzv_endpoint, --rdzv_backend, --rdzv_id,
// --master_addr, --master_port and --standalone are read: each from its flag, else from its PET_*
// variable (as torchrun reads them, and as the Kubeflow controller sets them), else torchrun's
// default; every value checked, every problem reported together naming the flag or variable.
// The rules, one per option:
//   nnodes          N or N:N (N >= 1). MIN:MAX with MIN < MAX is elastic membership, which ktune
//                   does not implement: refused. (Some releases of upstream Kubeflow Trainer's torch
//                   plugin set PET_NNODES=MIN:MAX for a runtime with mlPolicy.torch.elasticPolicy,
//                   starting MIN nodes that torchrun could later grow; later ones set the count.)
//   nproc_per_node  N >= 1, or auto (this node's GPUs, else its CPUs), cpu (its CPUs), gpu (its
//                   GPUs; refused without one), resolved here, on the node that runs.
//   node_rank       0 <= rank < nnodes. Only --node_rank / PET_NODE_RANK: GROUP_RANK, NODE_RANK,
//                   MASTER_ADDR, … are what a launcher sets for its workers, never read as input.
//   rdzv_endpoint   HOST[:PORT] (port 29500 when absent); when set it is the rendezvous address
//                   and --master_addr/--master_port are not used (torchrun's static rendezvous).
//   rdzv_backend    static or c10d; both meet at node 0's store, nodes ranked by node_rank.
//                   etcd and others are refused.
//   rdzv_id         any word; the workers' TORCHELASTIC_RUN_ID.
//   master_port     1..65535.
//   standalone      one node: nnodes must be 1; the rendezvous is 127.0.0.1 on a free port, in
//                   place of any endpoint or master address (as torchrun's --standalone).
// It does not start anything: run_launcher (launcher.h) does, from the plan.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"

namespace ktune::dist {

// A lookup of environment variables: this process's (getenv), or a fixed set (tests).
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;
EnvLookup process_environment();
EnvLookup environment_of(std::map<std::string, std::string> variables);

// One of torchrun's launcher options.
struct LauncherOption {
  const char* name;  // canonical, underscore spelling, without "--"
  const char* env;   // torchrun's PET_* variable, read when the flag is absent
  bool is_switch;    // takes no value (--standalone; --standalone=0 turns it off)
};
const std::vector<LauncherOption>& launcher_options();
// By name without "--", in either spelling (nproc_per_node or nproc-per-node); nullptr if unknown.
const LauncherOption* find_launcher_option(const std::string& name);

// A launcher option as given on the command line: its value, and the argument it came from
// ("--nnodes=1:4", or "--nnodes" when the value was the next argument), for errors.
struct GivenOption {
  std::string value;
  std::string where;
};
using LauncherArgs = std::map<std::string, GivenOption>;  // by canonical name; switches' value "1"

struct LaunchPlan {
  int nnodes = 1;
  int nproc_per_node = 1;
  int node_rank = 0;
  std::string rdzv_endpoint;  // as given ("" when unset); master_addr/master_port hold its parts
  std::string rdzv_backend = "static";
  std::string rdzv_id = "none";
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;  // 0 (node 0's store binds a free port) with --standalone, or one node
                            // given no --rdzv_endpoint nor --master_port, as torchtune's `tune run`
  bool standalone = false;
  std::chrono::milliseconds rdzv_timeout{std::chrono::seconds(300)};  // env KTUNE_RDZV_TIMEOUT (seconds)

  int world_size() const { return nnodes * nproc_per_node; }
  // Whether `ktune run` becomes the launcher of its workers: more than one process in the job, or
  // a rendezvous asked for (--rdzv_endpoint, as the Kubeflow runtime passes for multi-process
  // jobs, or --standalone). Otherwise it runs the recipe in its own process.
  bool launches_workers() const { return world_size() > 1 || !rdzv_endpoint.empty() || standalone; }
};

// Flags, then each one's PET_* variable, then defaults. Appends every problem to `errors`; the plan
// means something only when none was added.
LaunchPlan resolve_launch_plan(const LauncherArgs& args, const EnvLookup& env, std::vector<Error>& errors);
// The same, throwing ktune::Errors when there is any problem.
LaunchPlan resolve_launch_plan(const LauncherArgs& args, const EnvLookup& env = process_environment());

// NVIDIA GPUs on this node (devices under /proc/driver/nvidia/gpus).
int gpus_on_this_node();
// What --nproc_per_node=auto means: the GPUs, or without any the CPU cores (torchrun and the
// Kubeflow controller alike).
int auto_nproc_per_node();

}  // namespace ktune::dist
