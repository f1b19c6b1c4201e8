// `ktune run [launcher args] RECIPE --config NAME|FILE key=value…` — torchtune's `tune run`.
// With more than one process (or rendezvous arguments, as the Kubeflow runtimes pass) it becomes
// the launcher and re-executes itself as each worker with torchrun's env; a worker (RANK set)
// joins the Gloo process group and runs the recipe. Everything about the config is checked
// before anything loads.
#include <cstdio>
#include <memory>

#include "cli/command_table.h"
#include "cli/flag_args.h"
#include "core/error.h"
#include "core/log.h"
#include "dist/launcher.h"
#include "dist/process_group.h"
#include "dist/tcp_store.h"
#include "dist/worker_error.h"
#include "train/finetune_recipe.h"
#include "train/recipe_config.h"
#include "train/recipe_registry.h"
#include "train/run_command_line.h"

namespace ktune::cli {

namespace {

// Each worker runs the same command line; RANK in its env makes it a worker.
std::vector<std::string> worker_argv(const Args& args) {
  std::vector<std::string> argv = {"/proc/self/exe", "run"};
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

int run_usage() {
  std::printf(
      "usage: ktune run [LAUNCHER-OPTIONS] RECIPE --config NAME|FILE [key=value | ~key ...]\n"
      "\n"
      "Runs a fine-tuning recipe with a bundled config (see `ktune ls`) or a YAML file; key=value\n"
      "overrides set config keys (dotted: optimizer.lr=2e-5), ~key removes one. torchtune's `tune run`.\n"
      "\n"
      "launcher options (torchrun's, before the recipe; --opt VALUE or --opt=VALUE, - or _):\n"
      "  --nproc_per_node N      worker processes on this node\n"
      "  --nnodes N              nodes in the job\n"
      "  --node_rank R           this node's rank\n"
      "  --rdzv_endpoint H:P     where node 0's rendezvous store listens (or --master_addr, --master_port)\n"
      "  --rdzv_backend static|c10d, --rdzv_id ID   as torchrun takes them\n"
      "  --standalone            one node, its rendezvous on a free local port\n"
      "  each also read from its PET_* variable (PET_NNODES, ...), as Kubeflow Trainer sets them\n"
      "\n"
      "recipes:\n");
  for (const train::RecipeSpec& r : train::all_recipes()) std::printf("  %s\n", r.name.c_str());
  std::printf(
      "\n"
      "example: ktune run lora_finetune_single_device --config llama3_2/1B_lora_single_device \\\n"
      "           checkpointer.checkpoint_dir=/models/llama output_dir=/tmp/out epochs=1\n");
  return 0;
}

}  // namespace

int cmd_run(const Args& args) {
  if (!args.empty() && is_help_flag(args[0])) return run_usage();
  train::RunCommandLine run = train::parse_run_command_line(args);
  // Check the recipe and the config before starting any process, so that every error comes out once
  // (an unknown recipe named with the nearest one).
  train::RecipeConfig config = train::prepare_recipe_config(run.recipe, run.config, run.overrides);
  const train::RecipeSpec* recipe = train::find_recipe(run.recipe);
  std::optional<dist::WorkerEnv> worker = dist::read_worker_env();

  if (run.launch.launches_workers() && !worker) {
    const dist::LaunchPlan& plan = run.launch;
    if (!recipe->distributed && plan.world_size() > 1)
      throw Error("recipe " + recipe->name, "is single-device; it cannot run on " + std::to_string(plan.world_size()) +
                                                " processes (use the _distributed recipe)");
    return dist::run_launcher(plan, worker_argv(args));
  }

  if (!worker || worker->world_size == 1) {
    dist::SingleProcessGroup single;
    return train::run_finetune(config, *recipe, single);
  }
  if (!recipe->distributed)
    throw Error("recipe " + recipe->name, "is single-device; it cannot run on " + std::to_string(worker->world_size) + " processes");
  set_log_prefix("[rank" + std::to_string(worker->rank) + "] ");
  dist::TcpStore store(worker->master_addr, worker->master_port, std::chrono::seconds(300));
  auto group = dist::make_gloo_process_group(store, "ktune/pg", worker->rank, worker->world_size,
                                             dist::local_address_towards(worker->master_addr), worker->collective_timeout);
  try {
    return train::run_finetune(config, *recipe, *group,
                               train::WorkerDevices{&store, worker->local_rank, worker->collective_timeout});
  } catch (const std::exception& e) {
    // Recorded before the group closes: the peers waiting in a collective fail only once it has (and
    // say so: PeerLostError), so the launcher names this rank's cause first.
    dist::record_worker_error(redact(e.what()), dynamic_cast<const dist::PeerLostError*>(&e) != nullptr);
    throw;
  }
}

}  // namespace ktune::cli
