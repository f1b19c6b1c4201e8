// What a run tells the world while it trains, in torchtune's shapes (metric_logger's component):
//  - DiskLogger: `log_dir/log_<unix>.txt` (or its `filename`), one line a step:
//    `Step 12 | loss:2.3697 lr:0.0003 ...`;
//  - StdoutLogger: the same lines on stdout;
//  - TensorBoardLogger: a TensorBoard event file (tensorboard_events.h) in `log_dir/run_0_<time>`
//    (`organize_logs`, the default) or `log_dir`, one scalar a metric a step;
//  - with each of them, a JSON-lines twin `log_dir/metrics_<unix>.jsonl` ({"step": 12, "loss":
//    2.3697, ...}) for tools;
//  - the progress contract of the local backend: when KTUNE_PROGRESS_FILE is set, one JSON line a
//    logged step {"step","total_steps","epoch","loss","lr","tokens_per_second"} appended there
//    (src/sdk reads it into the job's status).
// Writes are flushed as they are made, so a killed run keeps every line it logged.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ktune {

using Metrics = std::vector<std::pair<std::string, double>>;  // in print order

enum class MetricSink { Disk, Stdout, TensorBoard };

struct MetricLoggerOptions {
  MetricSink sink = MetricSink::Disk;
  std::string log_dir;        // created if missing
  std::string filename;       // Disk: "" is log_<unix>.txt
  bool organize_logs = true;  // TensorBoard: the events go into a run_0_<time> folder of their own
};

class TensorBoardEventWriter;

class MetricLogger {
 public:
  // unix_time names the files (tests pass a fixed one); TensorBoard's run folder and events are
  // stamped with the clock.
  MetricLogger(const MetricLoggerOptions& options, int64_t unix_time);
  // A DiskLogger in log_dir.
  MetricLogger(const std::string& log_dir, int64_t unix_time);
  ~MetricLogger();
  MetricLogger(const MetricLogger&) = delete;
  MetricLogger& operator=(const MetricLogger&) = delete;

  void log(int64_t step, const Metrics& metrics);
  // For KTUNE_PROGRESS_FILE: also records the run's position.
  void progress(int64_t step, int64_t total_steps, int64_t epoch, double loss, double lr, double tokens_per_second);

  const std::string& text_path() const { return text_path_; }  // "" unless a DiskLogger
  const std::string& jsonl_path() const { return jsonl_path_; }
  std::string tensorboard_path() const;                         // "" unless a TensorBoardLogger

 private:
  std::string text_path_;
  std::string jsonl_path_;
  std::FILE* text_ = nullptr;  // the DiskLogger's file, or stdout (not closed)
  std::unique_ptr<TensorBoardEventWriter> tensorboard_;
  std::FILE* jsonl_ = nullptr;
  std::FILE* progress_ = nullptr;
};

// A metric value as torchtune's DiskLogger writes it: Python's str() of the float, the shortest text
// that reads back as the same number (2.36971, 3e-05, 1024.0, 0.0, nan).
std::string format_metric(double value);

}  // namespace ktune
