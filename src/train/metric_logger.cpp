#include "train/metric_logger.h"

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "train/config_interpolation.h"  // python_str
#include "train/tensorboard_events.h"

namespace ktune {

std::string format_metric(double value) { return train::python_str(train::ConfigNode::number(value)); }

static std::FILE* open_append(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (f == nullptr) throw Error(path, "cannot open for writing");
  return f;
}

// The wall clock in seconds, as Python's time.time().
static double seconds_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

MetricLogger::MetricLogger(const MetricLoggerOptions& options, int64_t unix_time) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(options.log_dir, ec);
  if (ec) throw Error(options.log_dir, "cannot create the log directory: " + ec.message());
  jsonl_path_ = (fs::path(options.log_dir) / ("metrics_" + std::to_string(unix_time) + ".jsonl")).string();
  switch (options.sink) {
    case MetricSink::Disk:
      text_path_ = (fs::path(options.log_dir) /
                    (options.filename.empty() ? "log_" + std::to_string(unix_time) + ".txt" : options.filename))
                       .string();
      text_ = open_append(text_path_);
      break;
    case MetricSink::Stdout:
      text_ = stdout;
      break;
    case MetricSink::TensorBoard: {
      const double now = seconds_now();
      fs::path dir = options.log_dir;
      if (options.organize_logs) {  // torchtune: log_dir/run_{rank}_{time.time()}, rank 0 the one that logs
        dir /= "run_0_" + format_metric(now);
        fs::create_directories(dir, ec);
        if (ec) throw Error(dir.string(), "cannot create the TensorBoard run directory: " + ec.message());
      }
      tensorboard_ = std::make_unique<TensorBoardEventWriter>((dir / tensorboard_event_file_name(int64_t(now))).string(), now);
      break;
    }
  }
  jsonl_ = open_append(jsonl_path_);
  if (const char* progress = std::getenv("KTUNE_PROGRESS_FILE"); progress != nullptr && *progress != 0)
    progress_ = open_append(progress);
}

MetricLogger::MetricLogger(const std::string& log_dir, int64_t unix_time)
    : MetricLogger(MetricLoggerOptions{MetricSink::Disk, log_dir}, unix_time) {}

MetricLogger::~MetricLogger() {
  for (std::FILE* f : {text_, jsonl_, progress_})
    if (f != nullptr && f != stdout) std::fclose(f);
}

std::string MetricLogger::tensorboard_path() const { return tensorboard_ ? tensorboard_->path() : std::string(); }

void MetricLogger::log(int64_t step, const Metrics& metrics) {
  std::string line = "Step " + std::to_string(step) + " | ";
  nlohmann::json record = {{"step", step}};
  const double now = tensorboard_ ? seconds_now() : 0.0;
  for (const auto& [name, value] : metrics) {
    line += name + ":" + format_metric(value) + " ";
    record[name] = std::isfinite(value) ? nlohmann::json(value) : nlohmann::json(format_metric(value));
    if (tensorboard_) tensorboard_->add_scalar(name, value, step, now);
  }
  if (text_ != nullptr) {
    std::fprintf(text_, "%s\n", line.c_str());
    std::fflush(text_);
  }
  std::fprintf(jsonl_, "%s\n", record.dump().c_str());
  std::fflush(jsonl_);
}

void MetricLogger::progress(int64_t step, int64_t total_steps, int64_t epoch, double loss, double lr,
                            double tokens_per_second) {
  if (progress_ == nullptr) return;
  nlohmann::json record = {{"step", step}, {"total_steps", total_steps}, {"epoch", epoch},
                           {"loss", std::isfinite(loss) ? nlohmann::json(loss) : nlohmann::json(nullptr)},
                           {"lr", lr}, {"tokens_per_second", tokens_per_second}};
  std::fprintf(progress_, "%s\n", record.dump().c_str());
  std::fflush(progress_);
}

}  // namespace ktune
