#include "train/metric_logger.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "train/config_interpolation.h"  // python_str

namespace ktune {

std::string format_metric(double value) { return train::python_str(train::ConfigNode::number(value)); }

static std::FILE* open_append(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (f == nullptr) throw Error(path, "cannot open for writing");
  return f;
}

MetricLogger::MetricLogger(const std::string& log_dir, int64_t unix_time) {
  std::error_code ec;
  std::filesystem::create_directories(log_dir, ec);
  if (ec) throw Error(log_dir, "cannot create the log directory: " + ec.message());
  text_path_ = (std::filesystem::path(log_dir) / ("log_" + std::to_string(unix_time) + ".txt")).string();
  jsonl_path_ = (std::filesystem::path(log_dir) / ("metrics_" + std::to_string(unix_time) + ".jsonl")).string();
  text_ = open_append(text_path_);
  jsonl_ = open_append(jsonl_path_);
  if (const char* progress = std::getenv("KTUNE_PROGRESS_FILE"); progress != nullptr && *progress != 0)
    progress_ = open_append(progress);
}

MetricLogger::~MetricLogger() {
  for (std::FILE* f : {text_, jsonl_, progress_})
    if (f != nullptr) std::fclose(f);
}

void MetricLogger::log(int64_t step, const Metrics& metrics) {
  std::string line = "Step " + std::to_string(step) + " | ";
  nlohmann::json record = {{"step", step}};
  for (const auto& [name, value] : metrics) {
    line += name + ":" + format_metric(value) + " ";
    record[name] = std::isfinite(value) ? nlohmann::json(value) : nlohmann::json(format_metric(value));
  }
  std::fprintf(text_, "%s\n", line.c_str());
  std::fflush(text_);
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
