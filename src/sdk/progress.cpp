// Reading the trainer's progress file (see progress.h for the contract). Only the head and the
// tail of the file are read; a malformed or partial line is skipped, never fatal: progress is a
// signal for the user, and a trainer bug must not make `ktune jobs get` fail.
#include "sdk/progress.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

namespace ktune::sdk {

using nlohmann::json;

std::optional<ProgressReport> parse_progress_line(const std::string& line) {
  json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("step") || !j["step"].is_number()) return std::nullopt;
  ProgressReport r;
  r.step = j["step"].get<long>();
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!it.value().is_number()) continue;
    const std::string& key = it.key();
    double v = it.value().get<double>();
    if (key == "step") continue;
    if (key == "total_steps") r.total_steps = long(v);
    else if (key == "epoch") r.epoch = v;
    else if (key == "time") r.time = v;
    else if (std::isfinite(v)) r.metrics[key] = v;
  }
  return r;
}

// Splits a chunk into complete lines; a chunk that does not end in '\n' loses its last piece.
static std::vector<std::string> complete_lines(const std::string& chunk, bool drop_first_partial) {
  std::vector<std::string> lines;
  size_t begin = 0;
  if (drop_first_partial) {
    size_t nl = chunk.find('\n');
    if (nl == std::string::npos) return lines;
    begin = nl + 1;
  }
  while (begin < chunk.size()) {
    size_t nl = chunk.find('\n', begin);
    if (nl == std::string::npos) break;  // trailing partial line: the writer is mid-write
    lines.push_back(chunk.substr(begin, nl - begin));
    begin = nl + 1;
  }
  return lines;
}

std::optional<ProgressSpan> read_progress_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (size <= 0) return std::nullopt;
  const std::streamoff window = 64 * 1024;

  auto read_range = [&](std::streamoff from, std::streamoff n) {
    std::string s(size_t(n), '\0');
    in.seekg(from);
    in.read(s.data(), n);
    s.resize(size_t(in.gcount()));
    in.clear();
    return s;
  };

  std::optional<ProgressReport> first, latest;
  for (const std::string& line : complete_lines(read_range(0, std::min(size, window)), false)) {
    if (auto r = parse_progress_line(line)) {
      first = r;
      break;
    }
  }
  if (!first) {
    if (size <= window) return std::nullopt;
  }
  const std::streamoff tail_from = std::max<std::streamoff>(0, size - window);
  std::vector<std::string> tail = complete_lines(read_range(tail_from, size - tail_from), tail_from > 0);
  for (auto it = tail.rbegin(); it != tail.rend(); ++it) {
    if (auto r = parse_progress_line(*it)) {
      latest = r;
      break;
    }
  }
  if (!latest) return std::nullopt;
  if (!first) first = latest;
  return ProgressSpan{*first, *latest};
}

JobProgress summarize_progress(const ProgressSpan& span, double started_at, double now, bool finished) {
  const ProgressReport& r = span.latest;
  JobProgress p;
  p.present = true;
  p.step = r.step;
  p.total_steps = r.total_steps;
  p.epoch = r.epoch;
  p.metrics = r.metrics;
  if (r.total_steps > 0) p.progress_percentage = std::clamp(100.0 * double(r.step) / double(r.total_steps), 0.0, 100.0);
  if (finished) {
    p.estimated_remaining_seconds = 0;
    return p;
  }
  if (r.total_steps <= 0 || r.step <= 0) return p;
  const double remaining_steps = double(std::max(0L, r.total_steps - r.step));
  // Prefer the trainer's own clock: the rate between the first and the latest report excludes
  // model loading and data preparation, which the time since the node started includes.
  if (span.first.time && r.time && r.step > span.first.step && *r.time > *span.first.time) {
    const double rate = double(r.step - span.first.step) / (*r.time - *span.first.time);  // steps/s
    const double since_latest = std::max(0.0, now - *r.time);
    p.estimated_remaining_seconds = std::max(0.0, remaining_steps / rate - since_latest);
  } else if (started_at > 0 && now > started_at) {
    p.estimated_remaining_seconds = (now - started_at) / double(r.step) * remaining_steps;
  }
  return p;
}

std::string JobProgress::to_json() const {
  if (!present) return "";
  json j = {{"step", step},
            {"total_steps", total_steps},
            {"epoch", epoch},
            {"progress_percentage", progress_percentage},
            {"estimated_remaining_seconds", estimated_remaining_seconds},
            {"metrics", metrics}};
  return j.dump();
}

JobProgress JobProgress::from_json(const std::string& text) {
  JobProgress p;
  if (text.empty()) return p;
  json j = json::parse(text, nullptr, false);
  if (!j.is_object()) return p;
  p.present = true;
  p.step = j.value("step", 0L);
  p.total_steps = j.value("total_steps", 0L);
  p.epoch = j.value("epoch", 0.0);
  p.progress_percentage = j.value("progress_percentage", -1.0);
  p.estimated_remaining_seconds = j.value("estimated_remaining_seconds", -1.0);
  if (j.contains("metrics") && j["metrics"].is_object())
    for (auto it = j["metrics"].begin(); it != j["metrics"].end(); ++it)
      if (it.value().is_number()) p.metrics[it.key()] = it.value().get<double>();
  return p;
}

}  // namespace ktune::sdk
