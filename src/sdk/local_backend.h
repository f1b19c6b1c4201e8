// LocalBackend: the embedded default backend. It runs a TrainJobPlan on this machine and keeps its
// jobs in the SQLite JobRegistry under $KTUNE_HOME, so `ktune jobs …` works from any later shell.
//
// submit() writes the job (status Created) to the registry, creates its workspace (the directory
// that plays the container's /workspace), and starts a detached supervisor — `ktune jobs supervise NAME`, double-forked
// into its own session with its stdio on <workspace>/logs/supervisor.log — that outlives the
// submitting command. Secrets travel to it through a pipe, never through the registry, argv or a
// file. The supervisor (run_supervisor) starts steps as soon as their dependencies are Complete
// (so the initializers run in parallel, then the nodes), each in its own process group with the
// torchrun env (PET_*, MASTER_ADDR=127.0.0.1, MASTER_PORT=a free port) and, for node steps,
// KTUNE_PROGRESS_FILE; it relays each step's output, with secrets redacted, to
// <workspace>/logs/<step>.log, records every transition, copies progress into the registry, and on
// the first failure stops the remaining steps.
//
// Readers (get_job, list_jobs) check that the supervisor of an unfinished job is still the process
// that registered (pid + start time). If it is gone, the job is marked Failed with the reason and
// its leftover step processes are stopped: a job is never shown Running forever.
// It deliberately does not plan, download or train: the steps do that.
#pragma once

#include <string>
#include <vector>

#include "sdk/backend.h"
#include "sdk/job_registry.h"

namespace ktune::sdk {

class LocalBackend : public Backend {
 public:
  explicit LocalBackend(BackendConfig config);  // resolves home, workspace root and ktune_exe

  std::string kind() const override { return "local"; }
  std::string submit(const TrainJobPlan& plan) override;
  std::vector<TrainJobRecord> list_jobs(const std::string& runtime = "") override;
  TrainJobRecord get_job(const std::string& name) override;
  void get_job_logs(const std::string& name, const std::string& step, bool follow,
                    const LogLineSink& sink) override;
  void delete_job(const std::string& name, bool remove_workspace = false) override;
  // Runs the exporter here over the job's <workspace>/output.
  ExportRecord export_job(const std::string& name, const ExportRequest& request, const LogLineSink& sink) override;

  const BackendConfig& config() const { return config_; }
  const std::string& registry_path() const { return registry_path_; }

 private:
  // Marks an unfinished job whose supervisor is gone as Failed and stops its leftovers.
  void reconcile(TrainJobRecord& job);
  JobRegistry& registry();

  BackendConfig config_;
  std::string registry_path_;
  std::unique_ptr<JobRegistry> registry_;
};

// The default home: $KTUNE_HOME, else $HOME/.ktune.
std::string default_ktune_home();

// The ktune binary: `configured` when given, else $KTUNE_EXE, else this process if it is ktune (or
// tune), else `ktune` on PATH; "" when none is found.
std::string resolve_ktune_exe(const std::string& configured);

// The detached supervisor's body (`ktune jobs supervise [--ready-fd N] NAME`): reads the secrets
// (JSON {step: {KEY: value}}) from stdin, registers itself, writes "ok\n" to ready_fd (if >= 0)
// and runs the job to its end. Returns the process exit code (0 when the job is Complete).
int run_supervisor(const std::string& home, const std::string& job_name, int ready_fd);
// The same from its command line: `[--home DIR] [--ready-fd N] NAME` (what follows `jobs supervise`).
int supervise_command(const std::vector<std::string>& args);

}  // namespace ktune::sdk
