// What a backend knows about a submitted TrainJob: its status, its steps (with status, devices,
// processes, exit codes, log paths), timestamps and progress. This is what `get_job` returns and
// what the local backend's SQLite registry stores. Upstream's SDK calls the same view TrainJob
// with Steps; ktune keeps that name for the Kubernetes object (runtime/), so these are records.
// It deliberately holds no secret: a step's secret_env never reaches a record.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "sdk/progress.h"

namespace ktune::sdk {

// TrainJob and step statuses, spelled as upstream's SDK spells them.
inline constexpr const char* kCreated = "Created";
inline constexpr const char* kRunning = "Running";
inline constexpr const char* kComplete = "Complete";
inline constexpr const char* kFailed = "Failed";
inline bool is_terminal(const std::string& status) { return status == kComplete || status == kFailed; }
const std::set<std::string>& all_job_statuses();  // {Created, Running, Complete, Failed}

struct StepRecord {
  std::string name;                        // "dataset-initializer", "model-initializer", "node-0", ...
  int index = 0;                           // position in the plan (dependency order)
  std::string status = kCreated;
  std::vector<std::string> command;        // as run: /workspace rewritten, `tune` resolved
  std::map<std::string, std::string> env;  // plan env + local additions; never secret_env
  std::vector<std::string> secret_env_keys;  // names only, so a reader knows which were passed
  std::string working_dir;
  std::vector<std::string> depends_on;
  int node_rank = -1;
  int num_proc = 1;
  std::string device = "cpu";              // what the step runs on
  std::string device_count = "1";
  int pid = 0;                             // also its process group id
  long long pid_start_time = 0;            // /proc/<pid>/stat field 22: tells a reused pid apart
  int exit_code = -1;                      // -1 while not exited; 128+N when killed by signal N
  double started_at = 0;                   // unix seconds; 0 = not yet
  double finished_at = 0;
  std::string log_path;
  std::string progress_path;               // node steps: the KTUNE_PROGRESS_FILE
  std::string pod_name;                    // Kubernetes backend: the step's pod ("" locally)
  std::string pod_phase;                   // Kubernetes backend: the pod's phase as the cluster says it
};

// One run of the exporter over a finished job's outputs (`ktune export --job`), upstream has none.
struct ExportRecord {
  int id = 0;
  std::string status = kRunning;           // Running, Complete or Failed
  std::string destination;                 // the URI (file://, s3://, hf://)
  std::string parts;                       // "adapter", "merged", "all", "available"
  double started_at = 0;
  double finished_at = 0;
  std::string summary_json;                // the exporter's summary (files, bytes, revision) when Complete
  std::string error;                       // why it Failed
};

struct TrainJobRecord {
  std::string name;
  std::string runtime;
  std::string trainer_type;                // "BuiltinTrainer" | "CustomTrainer"
  int num_nodes = 1;
  int num_proc_per_node = 1;
  std::string recipe;
  std::string config;
  std::string status = kCreated;
  std::string reason;                      // why it Failed (or "" )
  double created_at = 0;
  double started_at = 0;
  double finished_at = 0;
  std::string workspace;                   // the directory that plays /workspace
  int supervisor_pid = 0;
  long long supervisor_start_time = 0;
  JobProgress progress;
  std::vector<StepRecord> steps;
  std::vector<ExportRecord> exports;       // oldest first

  const StepRecord* step(const std::string& step_name) const;
};

}  // namespace ktune::sdk
