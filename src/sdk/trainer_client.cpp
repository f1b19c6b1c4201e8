// TrainerClient: planning through runtime/, everything else through the Backend, and the wait
// loop with upstream's errors (kubeflow.trainer's wait_for_job_status, message for message).
#include "sdk/trainer_client.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <thread>

#include "core/rfc3339.h"
#include "runtime/planner.h"
#include "runtime/trainjob_builder.h"
#include "sdk/local_backend.h"
#include "sdk/trainer_config_check.h"

namespace ktune::sdk {

namespace {

std::string set_text(const std::set<std::string>& s) {
  std::string out = "{";
  for (const std::string& v : s) out += (out.size() > 1 ? ", '" : "'") + v + "'";
  return out + "}";
}

std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

std::string number_text(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

// The local backend's runtimes: the builtin ones and the home's. (A cluster's come from the cluster.)
RuntimeCatalog catalog_for(const BackendConfig& config) {
  if (config.kind != BackendConfig::Kind::Local) return RuntimeCatalog();
  RuntimeCatalog catalog = RuntimeCatalog::builtin();
  const std::string dir = (config.home.empty() ? default_ktune_home() : config.home) + "/runtimes";
  if (std::filesystem::is_directory(dir)) {
    // Named: a range-for over a temporary's runtimes() would read a destroyed catalog.
    const RuntimeCatalog extra = RuntimeCatalog::load_dir(dir);
    for (const v1alpha1::TrainingRuntime& r : extra.runtimes()) catalog.add(r);
  }
  return catalog;
}

}  // namespace

std::string rfc3339(double unix_seconds) {
  if (unix_seconds <= 0) return "";
  return format_rfc3339(int64_t(unix_seconds));
}

TrainerClient::TrainerClient(const BackendConfig& config)
    : TrainerClient(make_backend(config), catalog_for(config)) {
  read_backend_runtimes_ = config.kind != BackendConfig::Kind::Local;
  const bool trainer_replaced = config.kind == BackendConfig::Kind::Local &&
                                (!config.trainer_command.empty() || (std::getenv("KTUNE_TRAINER_COMMAND") && *std::getenv("KTUNE_TRAINER_COMMAND")));
  if (!trainer_replaced) config_checker_exe_ = resolve_ktune_exe(config.ktune_exe);
}

TrainerClient::TrainerClient(std::unique_ptr<Backend> backend, RuntimeCatalog catalog)
    : backend_(std::move(backend)), catalog_(std::move(catalog)) {}

const RuntimeCatalog& TrainerClient::catalog() const {
  if (read_backend_runtimes_) {
    RuntimeCatalog now;
    for (v1alpha1::TrainingRuntime& r : backend_->runtimes()) now.add(std::move(r));
    catalog_ = std::move(now);
  }
  return catalog_;
}

std::vector<types::Runtime> TrainerClient::list_runtimes() const { return ktune::list_runtimes(catalog()); }

types::Runtime TrainerClient::get_runtime(const std::string& name) const {
  const RuntimeCatalog& runtimes = catalog();
  if (read_backend_runtimes_ && runtimes.find(name) == nullptr)
    throw Error("runtime " + name, "not found on the cluster (" + backend_->kind() + " backend); it has: " +
                                       (runtimes.names().empty() ? std::string("none") : join_names(runtimes.names())) +
                                       ". ktune's runtimes install with `kubectl apply --server-side -k manifests/`");
  return to_sdk_runtime(runtimes.get(name));
}

TrainJobPlan TrainerClient::plan(const types::Runtime& runtime, const types::Initializer* initializer,
                                 const types::Trainer& trainer, const types::JobOptions& options) const {
  return plan_of(make_trainjob(runtime, initializer, trainer, options), initializer, trainer, options);
}

TrainJobPlan TrainerClient::plan_of(const v1alpha1::TrainJob& job, const types::Initializer* initializer,
                                    const types::Trainer& trainer, const types::JobOptions& options) const {
  const RuntimeCatalog& runtimes = catalog();
  TrainJobPlan plan = build_plan(job, runtimes);
  plan.kubernetes_only = kubernetes_only_parts(initializer, trainer, options);
  check_trainer_config(plan, runtimes, config_checker_exe_);
  return plan;
}

std::string TrainerClient::train(const types::Runtime& runtime, const types::Initializer* initializer,
                                 const types::Trainer& trainer, const types::JobOptions& options) {
  return submit(plan(runtime, initializer, trainer, options));
}

std::string TrainerClient::submit(const TrainJobPlan& plan) { return backend_->submit(plan); }

types::TrainJob TrainerClient::to_sdk_job(const TrainJobRecord& r) const {
  types::TrainJob j;
  j.name = r.name;
  if (const v1alpha1::TrainingRuntime* rt = catalog_.find(r.runtime)) j.runtime = to_sdk_runtime(*rt);
  else j.runtime.name = r.runtime;
  j.num_nodes = r.num_nodes;
  j.creation_timestamp = rfc3339(r.created_at);
  j.status = r.status;
  for (const StepRecord& s : r.steps) {
    types::Step step;
    step.name = s.name;
    // On Kubernetes the pod's phase (Pending, Running, Succeeded, Failed), as upstream's SDK shows it;
    // locally the job's words (Created, Running, Complete, Failed), as upstream's local backend.
    step.status = s.pod_phase.empty() ? s.status : s.pod_phase;
    step.pod_name = s.pod_name.empty() ? s.name : s.pod_name;  // locally the step's name, as upstream's local backend
    step.device = s.device;
    step.device_count = s.device_count;
    j.steps.push_back(step);
  }
  if (r.progress.present) {
    if (r.progress.progress_percentage >= 0) j.progress.progress_percentage = int(std::floor(r.progress.progress_percentage));
    if (r.progress.estimated_remaining_seconds >= 0)
      j.progress.estimated_remaining_seconds = std::int64_t(std::llround(r.progress.estimated_remaining_seconds));
    for (const auto& [k, v] : r.progress.metrics) j.progress.metrics.emplace_back(k, number_text(v));
  }
  return j;
}

std::vector<types::TrainJob> TrainerClient::list_jobs(const std::string& runtime) {
  std::vector<types::TrainJob> out;
  const std::vector<TrainJobRecord> records = backend_->list_jobs(runtime);
  catalog();  // the jobs' runtimes as of now (to_sdk_job reads the catalog as last read)
  for (const TrainJobRecord& r : records) out.push_back(to_sdk_job(r));
  return out;
}

types::TrainJob TrainerClient::get_job(const std::string& name) {
  TrainJobRecord record = backend_->get_job(name);
  catalog();
  return to_sdk_job(record);
}

TrainJobRecord TrainerClient::get_job_record(const std::string& name) { return backend_->get_job(name); }

std::vector<std::string> TrainerClient::get_job_logs(const std::string& name, const std::string& step, bool follow) {
  std::vector<std::string> lines;
  backend_->get_job_logs(name, step, follow, [&](const std::string& l) {
    lines.push_back(l);
    return true;
  });
  return lines;
}

void TrainerClient::get_job_logs(const std::string& name, const std::string& step, bool follow,
                                 const LogLineSink& sink) {
  backend_->get_job_logs(name, step, follow, sink);
}

types::TrainJob TrainerClient::wait_for_job_status(const std::string& name, const std::set<std::string>& status,
                                                   double timeout, double polling_interval,
                                                   const std::function<void(const types::TrainJob&)>& callback,
                                                   const std::function<void()>& while_sleeping) {
  const std::string where = "wait_for_job_status(" + name + ")";
  const std::set<std::string>& all = all_job_statuses();
  // Upstream's order: its API layer checks the times (common.utils.validate_wait_for_job_status),
  // then its backend the statuses.
  if (!(timeout > 0)) throw Error(where, "Timeout must be a positive number, got timeout=" + number_text(timeout));
  if (!(polling_interval > 0))
    throw Error(where, "Polling interval must be a positive number, got polling_interval=" + number_text(polling_interval));
  if (polling_interval >= timeout)
    throw Error(where, "Polling interval must be strictly less than timeout. Received polling_interval=" +
                           number_text(polling_interval) + ", timeout=" + number_text(timeout));
  for (const std::string& s : status)
    if (!all.count(s)) throw Error(where, "Expected status " + set_text(status) + " must be a subset of " + set_text(all));
  // Upstream waits out the timeout on an empty set; a wait that cannot end is refused here.
  if (status.empty()) throw Error(where, "Expected status {} must name at least one of " + set_text(all));
  using clock = std::chrono::steady_clock;
  const clock::time_point deadline =
      clock::now() + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(timeout));
  catalog();  // once: the runtime a polled job shows is the one it had when the wait began
  while (true) {
    TrainJobRecord record = backend_->get_job(name);
    types::TrainJob job = to_sdk_job(record);
    if (callback) callback(job);
    if (!status.count(types::kTrainJobFailed) && job.status == types::kTrainJobFailed)
      throw JobFailedError(where, "TrainJob " + name + " is Failed" + (record.reason.empty() ? "" : ": " + record.reason));
    if (status.count(job.status)) return job;
    const auto now = clock::now();
    if (now >= deadline) break;
    const clock::duration interval =
        std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(polling_interval));
    const clock::time_point wake = now + std::min(interval, deadline - now);
    // In slices, so that while_sleeping (a caller's Ctrl-C check) runs at least 5 times a second.
    for (clock::time_point t = clock::now(); t < wake; t = clock::now()) {
      std::this_thread::sleep_for(std::min<clock::duration>(wake - t, std::chrono::milliseconds(200)));
      if (while_sleeping) while_sleeping();
    }
  }
  throw WaitTimeoutError(where, "Timeout waiting for TrainJob " + name + " to reach status: " + set_text(status));
}

std::vector<types::Event> TrainerClient::get_job_events(const std::string& name) {
  return backend_->get_job_events(name);
}

void TrainerClient::delete_job(const std::string& name, bool remove_workspace) {
  backend_->delete_job(name, remove_workspace);
}

ExportRecord TrainerClient::export_job(const std::string& name, const ExportRequest& request, const LogLineSink& sink) {
  return backend_->export_job(name, request, sink);
}

std::string format_runtimes_table(const std::vector<types::Runtime>& runtimes) {
  std::vector<std::vector<std::string>> rows = {
      {"Runtime", "Trainer Type", "Framework", "Pretrained Model", "Accelerator", "Count"}};
  for (const types::Runtime& r : runtimes) {
    rows.push_back({r.name,
                    r.trainer.trainer_type == types::TrainerType::BuiltinTrainer ? "builtin-trainer" : "custom-trainer",
                    r.trainer.framework.empty() ? "<undefined>" : r.trainer.framework,
                    r.pretrained_model.value_or("<undefined>"), r.trainer.device, r.trainer.device_count});
  }
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& row : rows)
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      line += row[c];
      if (c + 1 < row.size()) line += std::string(width[c] - row[c].size() + 3, ' ');
    }
    out += line + "\n";
  }
  return out;
}

}  // namespace ktune::sdk
