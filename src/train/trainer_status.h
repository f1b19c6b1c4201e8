// The run's progress in its TrainJob's status on Kubernetes, as Kubeflow Trainer (>= 2.2, the
// TrainJobStatus feature gate; KEP-2779) takes it: where the controller injected
//   KUBEFLOW_TRAINER_SERVER_URL      https://<controller>/apis/trainer.kubeflow.org/v1alpha1/
//                                    namespaces/<ns>/trainjobs/<name>/status
//   KUBEFLOW_TRAINER_SERVER_CA_CERT  the controller's CA (a file)
//   KUBEFLOW_TRAINER_SERVER_TOKEN    a projected service-account token (a file, read at each send:
//                                    the kubelet rotates it)
// (the names upstream's SDK, update_trainjob_status, reads; the KEP's KUBEFLOW_TRAINER_STATUS_*
// spelling is taken too), rank 0 POSTs {"trainerStatus": {"progressPercentage",
// "estimatedRemainingSeconds", "metrics": [{"name", "value"}], "lastUpdatedTime"}} with the token as
// its bearer, and the controller writes it into status.trainerStatus, where `kubectl get trainjob`,
// the SDK's get_job and ktune's Kubernetes backend read it. (Locally, the supervisor reads
// KTUNE_PROGRESS_FILE instead: metric_logger.h.)
//
// Training never waits on it: report() hands the latest status to a worker thread, which sends at
// most one every min_interval seconds (the first and the last at once) and gives up on a status
// the endpoint does not take (one warning, naming the URL and the answer, never the token). The
// final status is sent before the reporter goes, waiting a bounded time.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace ktune {

// Where a run is, as the recipe knows it.
struct TrainerProgress {
  int64_t step = 0;          // optimizer steps done (global, across epochs; resumed runs count on)
  int64_t total_steps = 0;   // of the whole run
  int64_t epoch = 0;         // 0-based, as torchtune counts
  int64_t total_epochs = 0;
  std::vector<std::pair<std::string, double>> metrics;  // loss, lr, tokens_per_second, val_loss, ...
};

// The request body for `progress`, observed at `now` (unix seconds); remaining_seconds when known.
std::string trainer_status_body(const TrainerProgress& progress, std::optional<double> remaining_seconds, int64_t now);

struct TrainerStatusEndpoint {
  std::string url;
  std::string ca_file;     // "" = the system's CAs
  std::string token_file;  // "" = no Authorization header
};

class TrainerStatusReporter {
 public:
  // From the KUBEFLOW_TRAINER_SERVER_* (else _STATUS_*) variables, for rank 0 only; null where no URL is set.
  // KTUNE_TRAINER_STATUS_INTERVAL_SECONDS overrides the interval (default 15 s).
  static std::unique_ptr<TrainerStatusReporter> from_env(int rank);

  TrainerStatusReporter(TrainerStatusEndpoint endpoint, double min_interval_seconds);
  ~TrainerStatusReporter();  // finish()
  TrainerStatusReporter(const TrainerStatusReporter&) = delete;
  TrainerStatusReporter& operator=(const TrainerStatusReporter&) = delete;

  // The run's latest position; the first and the last (step == total_steps) are sent at once. A
  // metric reported once stays in later statuses until reported again (val_loss between evaluations).
  void report(int64_t step, int64_t total_steps, int64_t epoch, int64_t total_epochs,
              const std::vector<std::pair<std::string, double>>& metrics);
  // Sends what is pending, waiting at most `wait_seconds`; a send still in flight then is left to
  // finish on its own (the worker owns what it uses).
  void finish(double wait_seconds = 10);

  int64_t sent() const;  // statuses the endpoint took (2xx)

  // After a failed send the next status is tried an interval later; a refusal (4xx other than 408
  // and 429) or this many failures in a row end the reporting, with a warning.
  static constexpr int kMaxFailuresInARow = 5;

 private:
  struct Shared;
  static void run(std::shared_ptr<Shared> shared);

  std::shared_ptr<Shared> shared_;
  std::thread worker_;
};

}  // namespace ktune
