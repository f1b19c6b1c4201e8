// The command line of `ktune run` (torchtune's `tune run`), parsed into its three parts:
//   ktune run [launcher args] RECIPE --config NAME|FILE [key=value | ~key ...]
// Launcher args are torchrun's and come before the recipe, in either spelling (underscore or dash)
// and either form (--nnodes=2 or --nnodes 2): --nnodes, --nproc_per_node, --node_rank,
// --rdzv_endpoint, --rdzv_backend, --rdzv_id, --master_addr, --master_port, --standalone. This file
// only finds them; dist::resolve_launch_plan (dist/launch_plan.h) reads their values and their
// PET_* environment into the launch plan, once, and whether to launch workers is the plan's answer.
// After the recipe, --config may come anywhere among the overrides; other --flags are refused,
// as torchtune refuses them. Every problem, the launcher options' included, is reported together
// (ktune::Errors). Starting processes is the launcher's job, the config is config_*.h's.
#pragma once

#include <string>
#include <vector>

#include "dist/launch_plan.h"

namespace ktune::train {

struct RunCommandLine {
  dist::LaunchPlan launch;  // the launcher options and their PET_* env (ask launch.launches_workers())
  std::string recipe;
  std::string config;
  std::vector<std::string> overrides;  // key=value and ~key, in order
};

using dist::EnvLookup;
using dist::process_environment;

// args: what follows `run` on the command line.
RunCommandLine parse_run_command_line(const std::vector<std::string>& args,
                                      const EnvLookup& env = process_environment());

}  // namespace ktune::train
