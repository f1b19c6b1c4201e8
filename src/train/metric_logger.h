// What a run tells the world while it trains, in torchtune's shapes:
//  - DiskLogger: `log_dir/log_<unix>.txt`, one line a step: `Step 12 | loss:2.3697 lr:0.0003 ...`
//  - a JSON-lines twin `log_dir/metrics_<unix>.jsonl` ({"step": 12, "loss": 2.3697, ...}) for tools;
//  - the progress contract of the local backend: when KTUNE_PROGRESS_FILE is set, one JSON line a
//    logged step {"step","total_steps","epoch","loss","lr","tokens_per_second"} appended there
//    (src/sdk reads it into the job's status).
// Writes are line-buffered and flushed, so a killed run keeps every line it logged.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace ktune {

using Metrics = std::vector<std::pair<std::string, double>>;  // in print order

class MetricLogger {
 public:
  // log_dir is created if missing. unix_time names the files (tests pass a fixed one).
  MetricLogger(const std::string& log_dir, int64_t unix_time);
  ~MetricLogger();
  MetricLogger(const MetricLogger&) = delete;
  MetricLogger& operator=(const MetricLogger&) = delete;

  void log(int64_t step, const Metrics& metrics);
  // For KTUNE_PROGRESS_FILE: also records the run's position.
  void progress(int64_t step, int64_t total_steps, int64_t epoch, double loss, double lr, double tokens_per_second);

  const std::string& text_path() const { return text_path_; }
  const std::string& jsonl_path() const { return jsonl_path_; }

 private:
  std::string text_path_;
  std::string jsonl_path_;
  std::FILE* text_ = nullptr;
  std::FILE* jsonl_ = nullptr;
  std::FILE* progress_ = nullptr;
};

// A metric value as torchtune's DiskLogger writes it: Python's str() of the float, the shortest text
// that reads back as the same number (2.36971, 3e-05, 1024.0, 0.0, nan).
std::string format_metric(double value);

}  // namespace ktune
