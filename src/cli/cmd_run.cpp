// `ktune run [launcher args] RECIPE --config NAME|FILE key=value…` — torchtune's `tune run`.
// With more than one process (or rendezvous arguments, as the Kubeflow runtimes pass) it becomes
// the launcher and re-executes itself as each worker with torchrun's env; a worker (RANK set)
// joins the Gloo process group and runs the recipe. Everything about the config is checked
// before anything loads.
#include <cstdio>
#include <memory>

#include "cli/command_table.h"
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

}  // namespace

int cmd_run(const Args& args) {
  train::RunCommandLine run = train::parse_run_command_line(args);
  const train::RecipeSpec* recipe = train::find_recipe(run.recipe);
  if (recipe == nullptr) throw Error("recipe '" + run.recipe + "'", "unknown recipe (see `ktune ls`)");
  std::optional<dist::WorkerEnv> worker = dist::read_worker_env();

  // Check the config before starting any process, so that every error comes out once.
  train::RecipeConfig config = train::prepare_recipe_config(run.recipe, run.config, run.overrides);

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
