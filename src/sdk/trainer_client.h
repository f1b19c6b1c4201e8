// TrainerClient: the one object a data scientist uses, with upstream's method names and shapes
// (kubeflow.trainer.TrainerClient): list_runtimes, get_runtime, train, list_jobs, get_job,
// get_job_logs, wait_for_job_status (with upstream's three errors), delete_job. train() builds
// the TrainJob (runtime/trainjob_builder.h), validates and plans it (runtime/planner.h), checks the
// trainer's config (sdk/trainer_config_check.h) and hands the plan to the backend chosen by
// BackendConfig; everything after that is the backend's.
// It deliberately adds no behaviour of its own beyond the waiting loop: the CLI is a thin layer
// over this class, and so will the Python face be.
#pragma once

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "runtime/runtime_catalog.h"
#include "runtime/sdk_types.h"
#include "sdk/backend.h"

namespace ktune::sdk {

// wait_for_job_status: the job reached Failed while Failed was not awaited (upstream: RuntimeError).
class JobFailedError : public Error {
 public:
  using Error::Error;
};
// wait_for_job_status: the deadline passed (upstream: TimeoutError).
class WaitTimeoutError : public Error {
 public:
  using Error::Error;
};

class TrainerClient {
 public:
  // The backend from `config` (BackendConfig::from_env() reads KTUNE_BACKEND, KTUNE_HOME, ...) and
  // its runtimes: locally those compiled from manifests/ plus any in <home>/runtimes (a later one
  // replaces a builtin); on Kubernetes the cluster's, read again at every call that needs them (as
  // upstream's SDK reads them), so that a runtime installed later is seen and one the cluster lacks
  // is not offered. Nothing is read from a cluster until a call needs it.
  explicit TrainerClient(const BackendConfig& config = BackendConfig::from_env());
  // A fixed catalog (tests, tools), never read again.
  TrainerClient(std::unique_ptr<Backend> backend, RuntimeCatalog catalog);

  std::vector<types::Runtime> list_runtimes() const;
  types::Runtime get_runtime(const std::string& name) const;

  // The plan train() would run, without running it (`ktune train --dry-run`).
  TrainJobPlan plan(const types::Runtime& runtime, const types::Initializer* initializer,
                    const types::Trainer& trainer, const types::JobOptions& options = {}) const;
  // The same for a TrainJob already made from the call (make_trainjob), which a caller keeps (the
  // Python SDK renders its YAML): validated and planned, with the call's Kubernetes-only parts.
  TrainJobPlan plan_of(const v1alpha1::TrainJob& job, const types::Initializer* initializer, const types::Trainer& trainer,
                       const types::JobOptions& options) const;
  // Starts a TrainJob and returns its name (a letter + 11 hex characters unless options.name is given).
  std::string train(const types::Runtime& runtime, const types::Initializer* initializer = nullptr,
                    const types::Trainer& trainer = {}, const types::JobOptions& options = {});
  // Runs an already built plan (what train() does after planning).
  std::string submit(const TrainJobPlan& plan);

  std::vector<types::TrainJob> list_jobs(const std::string& runtime = "");
  types::TrainJob get_job(const std::string& name);
  // Everything the backend knows (commands, pids, exit codes, timestamps, log paths, progress).
  TrainJobRecord get_job_record(const std::string& name);

  // The lines of one step's log ("node-0", "dataset-initializer", ...). With follow, blocks until
  // the step ends; the sink form streams lines as they come and may stop early by returning false.
  std::vector<std::string> get_job_logs(const std::string& name, const std::string& step = "node-0",
                                        bool follow = false);
  void get_job_logs(const std::string& name, const std::string& step, bool follow, const LogLineSink& sink);

  // Polls until the job's status is one of `status`. Throws Error when timeout <= 0,
  // polling_interval <= 0, polling_interval >= timeout or `status` is not a subset of {Created,
  // Running, Complete, Failed} (upstream's checks, in its order), or is empty (upstream waits out
  // the timeout); JobFailedError when the job Failed and Failed was not
  // awaited; WaitTimeoutError after `timeout` seconds. `callback`, if set, sees every polled state;
  // `while_sleeping`, if set, runs at least 5 times a second between polls (an exception it throws,
  // such as a Ctrl-C, ends the wait).
  types::TrainJob wait_for_job_status(const std::string& name,
                                      const std::set<std::string>& status = {types::kTrainJobComplete},
                                      double timeout = 600, double polling_interval = 2,
                                      const std::function<void(const types::TrainJob&)>& callback = {},
                                      const std::function<void()>& while_sleeping = {});

  // The cluster's events about the job, oldest first (Kubernetes); NotSupportedError locally.
  std::vector<types::Event> get_job_events(const std::string& name);

  // Stops the job's processes and forgets it (with remove_workspace, its files too).
  void delete_job(const std::string& name, bool remove_workspace = false);

  // Ships a Complete job's adapter and/or merged model to file://, s3:// or hf:// and records the
  // export with the job (sdk/job_export.h; upstream has no exporter). `sink` gets the exporter's log.
  ExportRecord export_job(const std::string& name, const ExportRequest& request, const LogLineSink& sink = {});

  // The ktune binary that checks a torchtune job's trainer config before it starts
  // (sdk/trainer_config_check.h): from BackendConfig, the one the local backend runs (for Kubernetes,
  // the same resolution: this machine's ktune stands for the image's); none where the local trainer
  // is replaced (trainer_command) or no ktune is found. "" turns the check off.
  void set_trainer_config_checker(std::string ktune_exe) { config_checker_exe_ = std::move(ktune_exe); }
  const std::string& trainer_config_checker() const { return config_checker_exe_; }

  Backend& backend() { return *backend_; }
  // The runtimes as of now (on Kubernetes, read from the cluster by this call).
  const RuntimeCatalog& catalog() const;

 private:
  types::TrainJob to_sdk_job(const TrainJobRecord& record) const;

  std::unique_ptr<Backend> backend_;
  bool read_backend_runtimes_ = false;  // the backend's runtimes are the catalog, read at each call
  mutable RuntimeCatalog catalog_;      // the catalog as last read
  std::string config_checker_exe_;      // "" = no trainer config check
};

// The design's table of list_runtimes(): Runtime, Trainer Type, Framework, Pretrained Model,
// Accelerator, Count — one row per runtime, columns padded to their widest cell.
std::string format_runtimes_table(const std::vector<types::Runtime>& runtimes);

// Unix seconds -> RFC 3339 UTC ("2026-12-02T13:10:00Z"); "" for 0.
std::string rfc3339(double unix_seconds);

}  // namespace ktune::sdk
