// The control plane's plugins, as Kubeflow Trainer's runtime framework has them: each one policy
// behind a small interface (enforce the ML policy, validate, mutate, build plan steps), each plugin
// implementing the few it needs, run in a fixed order over one RuntimeInfo:
//
//   TrainerKind  BuiltinTrainer only on torchtune runtimes, CustomTrainer only elsewhere
//   Torch        node count, processes per node (auto -> GPUs else CPUs), PET_* env, port 29500
//   TorchTune    model key, recipe/config table, `tune run` command, torchtune rules
//   Initializer  dataset-initializer and model-initializer steps (STORAGE_URI, ACCESS_TOKEN, ...)
//   JobSet       one step per node, wired to the steps it depends on
//
// A new framework is a new plugin, not a new `if` in an old one. Plugins never throw on a user
// mistake: they append an Error with its field path, and validation reports them all.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "runtime/plan.h"
#include "runtime/recipe_table.h"
#include "runtime/v1alpha1.h"

namespace ktune {

inline constexpr int kTrainerPort = 29500;

// What the plugins build up for one TrainJob on one runtime (upstream's runtime.Info).
struct RuntimeInfo {
  const v1alpha1::TrainJob* job = nullptr;
  const v1alpha1::TrainingRuntime* runtime = nullptr;
  const ConfigSet* configs = nullptr;             // what the trainer image ships
  v1alpha1::Trainer trainer;                      // the job's spec.trainer (empty when unset)
  std::optional<v1alpha1::ReplicatedJob> node_job;  // the runtime's trainer replicated job
  v1alpha1::Container node;                       // its "node" container (empty name when missing)

  // Torch ML policy.
  int num_nodes = 1;
  std::string num_proc_policy = "auto";           // "auto" | "cpu" | "gpu" | an integer
  int num_proc_per_node = 1;
  v1alpha1::ResourceRequirements resources;       // the job's resourcesPerNode, else the node's
  std::string device = "cpu";                     // "gpu" when the resources name a GPU
  std::string node_rank_env;                      // env var set to each node's rank ("PET_NODE_RANK")
  int container_port = 0;

  // The node process.
  std::vector<std::string> node_command;          // command + args
  std::vector<std::pair<std::string, std::string>> node_env;  // in order; upsert_env() replaces
  std::string image;

  // TorchTune.
  std::string model_key;
  std::string recipe;
  std::string config;

  std::vector<Error> errors;                      // problems found while enforcing the policy

  bool torchtune_entrypoint() const;              // the job's command is exactly {"tune", "run"}
  void upsert_env(const std::string& name, const std::string& value);
};

class Plugin {
 public:
  virtual ~Plugin() = default;
  virtual const char* name() const = 0;
  virtual void enforce_ml_policy(RuntimeInfo&) const {}
  virtual void validate(const RuntimeInfo&, std::vector<Error>&) const {}
  virtual void mutate(RuntimeInfo&) const {}
  virtual void build_steps(const RuntimeInfo&, TrainJobPlan&) const {}
};

// The plugins, in the order they run.
const std::vector<std::unique_ptr<Plugin>>& plugins();

std::unique_ptr<Plugin> make_trainer_kind_plugin();
std::unique_ptr<Plugin> make_torch_plugin();
std::unique_ptr<Plugin> make_torchtune_plugin();
std::unique_ptr<Plugin> make_initializer_plugin();
std::unique_ptr<Plugin> make_jobset_plugin();

// The RuntimeInfo of a job on a runtime, before any plugin ran.
RuntimeInfo make_runtime_info(const v1alpha1::TrainJob& job, const v1alpha1::TrainingRuntime& runtime,
                              const ConfigSet& configs);
// Runs enforce_ml_policy and validate of every plugin: the errors of both, in plugin order.
std::vector<Error> run_plugin_validation(RuntimeInfo& info);

// A Kubernetes quantity ("2", "500m", "1.5", "16Gi") as a number; nullopt when malformed.
std::optional<double> parse_quantity(const std::string& q);

}  // namespace ktune
