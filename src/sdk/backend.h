// Backend: where a TrainJobPlan runs. TrainerClient talks only to this interface, so the local
// backend (processes on this machine + a SQLite registry, the embedded default) and the
// Kubernetes backend (a TrainJob over the API server) are interchangeable, chosen
// by BackendConfig (or the environment: KTUNE_BACKEND=local|kubernetes).
// It deliberately does not plan: it runs the steps it is given, in their dependency order.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "runtime/plan.h"
#include "runtime/sdk_types.h"
#include "runtime/v1alpha1.h"
#include "sdk/job_export.h"
#include "sdk/job_record.h"

namespace ktune::sdk {

struct BackendConfig {
  enum class Kind { Local, Kubernetes };
  Kind kind = Kind::Local;

  // Local backend.
  std::string home;              // registry.db and jobs/ live here; "" = $KTUNE_HOME, else ~/.ktune
  std::string workspace_root;    // a job's workspace is <workspace_root>/<name>; "" = <home>/jobs
  std::string ktune_exe;         // runs `jobs supervise` and stands for `tune`/`ktune` in commands;
                                 // "" = $KTUNE_EXE, else this process if it is ktune, else `ktune` on PATH
  std::vector<std::string> trainer_command;  // replaces a node step's leading `tune run` (tests, other
                                             // trainers); "" = $KTUNE_TRAINER_COMMAND split on spaces
  double stop_grace_seconds = 10;  // SIGTERM → SIGKILL when stopping a step's processes

  // Kubernetes backend (kubernetes_backend.h): a TrainJob over the API server.
  std::string kubernetes_namespace;  // "" = the context's namespace, else "default"; $KTUNE_NAMESPACE
  std::string kubeconfig;            // "" = $KUBECONFIG, else ~/.kube/config, else in-cluster
  std::string kubernetes_context;    // "" = current-context; $KTUNE_KUBE_CONTEXT

  // Kind from KTUNE_BACKEND, the rest from the variables named above; unset fields keep defaults.
  static BackendConfig from_env();
  // The CLI's backend flags: --backend local|kubernetes, --namespace, --kubeconfig, --context.
  // Returns false for any other flag; throws Error on a bad value.
  bool apply_flag(const std::string& flag, const std::string& value);
  static bool is_flag(const std::string& flag);
};

// A call the backend cannot answer at all (the local backend has no cluster events; upstream's
// local backends raise NotImplementedError there too).
class NotSupportedError : public Error {
 public:
  using Error::Error;
};

// Called once per log line (without its '\n'); return false to stop reading.
using LogLineSink = std::function<bool(const std::string& line)>;

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string kind() const = 0;  // "local", "kubernetes"

  // Starts the plan and returns the job name (plan.job_name, or a new one: a letter + 11 hex characters).
  virtual std::string submit(const TrainJobPlan& plan) = 0;
  virtual std::vector<TrainJobRecord> list_jobs(const std::string& runtime = "") = 0;
  virtual TrainJobRecord get_job(const std::string& name) = 0;  // throws Error if there is none
  // Lines of one step's log; with follow, keeps reading until the step has finished and its log
  // is drained (or the sink returns false).
  virtual void get_job_logs(const std::string& name, const std::string& step, bool follow,
                            const LogLineSink& sink) = 0;
  // Stops the job's processes and forgets it; with remove_workspace also deletes its files.
  virtual void delete_job(const std::string& name, bool remove_workspace = false) = 0;
  // Exports a Complete job's outputs (job_export.h) and records it with the job; `sink` gets the
  // exporter's log lines. Returns the record: Complete with the summary, or Running when a cluster's
  // export outlasts request.timeout_seconds. Throws when the export cannot start or fails (the
  // record says Failed with the error).
  virtual ExportRecord export_job(const std::string& name, const ExportRequest& request, const LogLineSink& sink) = 0;
  // Runtimes the backend's own store holds (the cluster's ClusterTrainingRuntimes and the
  // namespace's TrainingRuntimes); TrainerClient adds them over the builtin catalog. None locally.
  virtual std::vector<v1alpha1::TrainingRuntime> runtimes() { return {}; }
  // The cluster's events about the job's objects, oldest first. NotSupportedError where the backend
  // has none (the local one).
  virtual std::vector<types::Event> get_job_events(const std::string& name) {
    throw NotSupportedError("get_job_events(" + name + ")",
                            "the " + kind() + " backend has no cluster events (its logs and steps say what happened)");
  }
};

std::unique_ptr<Backend> make_backend(const BackendConfig& config);

}  // namespace ktune::sdk
