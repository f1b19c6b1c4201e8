// JobRegistry: the local backend's SQLite database of TrainJobs ($KTUNE_HOME/registry.db), so that
// a job submitted from one shell can be listed, followed, waited for and deleted from any other,
// and outlives the command that started it. WAL mode and a busy timeout let the supervisor of
// every running job write while any number of readers read. Every write is one short IMMEDIATE
// transaction; status changes that race (a reader marking a dead job Failed while its supervisor
// writes Complete) are conditional updates, so the first writer wins and nothing is half-written.
// One JobRegistry is one connection: use one per thread (or per process), never share it.
// It deliberately knows nothing of processes: deciding that a job is dead is the backend's job.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "sdk/job_record.h"

struct sqlite3;

namespace ktune::sdk {

class JobRegistry {
 public:
  explicit JobRegistry(const std::string& db_path);  // creates the file and schema if missing
  ~JobRegistry();
  JobRegistry(const JobRegistry&) = delete;
  JobRegistry& operator=(const JobRegistry&) = delete;

  const std::string& path() const { return path_; }

  // Inserts a job and all its steps in one transaction; throws if the name is taken.
  void insert(const TrainJobRecord& job);
  std::optional<TrainJobRecord> find(const std::string& name);
  std::vector<TrainJobRecord> list(const std::string& runtime = "");  // oldest first
  bool remove(const std::string& name);  // false if there was none

  // Job transitions. Each returns whether a row changed.
  bool set_supervisor(const std::string& name, int pid, long long start_time);
  bool mark_job_running(const std::string& name, double now);
  // Sets a terminal status unless the job is already terminal (first writer wins).
  bool finish_job(const std::string& name, const std::string& status, const std::string& reason, double now);
  // As finish_job, but only while the recorded supervisor is still `supervisor_pid` (readers use it).
  bool fail_job_if_supervisor(const std::string& name, int supervisor_pid, const std::string& reason, double now);
  bool set_progress(const std::string& name, const JobProgress& progress);

  // Step transitions.
  // Records the started process, and the command and env exactly as it was started with them
  // (the local backend fills in the rendezvous port only when the first node starts).
  bool mark_step_running(const std::string& job, const std::string& step, int pid, long long start_time,
                         double now, const std::vector<std::string>& command,
                         const std::map<std::string, std::string>& env);
  bool finish_step(const std::string& job, const std::string& step, const std::string& status, int exit_code,
                   double now);
  // When a job ends early: Running steps become Failed; steps never started stay Created.
  int fail_running_steps(const std::string& job, double now);

  // Exports of a job's outputs: begin_export records one Running and returns its id (throws when
  // there is no such job); finish_export sets Complete (with the summary) or Failed (with the error).
  int begin_export(const std::string& job, const std::string& destination, const std::string& parts, double now);
  bool finish_export(int id, const std::string& status, const std::string& summary_json, const std::string& error,
                     double now);

 private:
  std::vector<TrainJobRecord> query_jobs(const std::string& where, const std::string& arg);
  std::string path_;
  sqlite3* db_ = nullptr;
};

}  // namespace ktune::sdk
