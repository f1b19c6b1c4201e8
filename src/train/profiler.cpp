// The step profiler (see profiler.h).
#include "train/profiler.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"

namespace ktune {

namespace fs = std::filesystem;

std::string chrome_trace_json(const std::vector<trace::SpanRecord>& spans, int64_t origin_ns, int rank) {
  nlohmann::ordered_json events = nlohmann::ordered_json::array();
  std::vector<const trace::SpanRecord*> ordered;
  for (const trace::SpanRecord& s : spans) ordered.push_back(&s);
  std::stable_sort(ordered.begin(), ordered.end(),
                   [](const auto* a, const auto* b) { return a->start_ns < b->start_ns; });
  for (const trace::SpanRecord* s : ordered)
    events.push_back({{"name", s->name},
                      {"cat", s->category},
                      {"ph", "X"},
                      {"ts", double(s->start_ns - origin_ns) / 1e3},
                      {"dur", double(s->duration_ns) / 1e3},
                      {"pid", rank},
                      {"tid", s->thread}});
  nlohmann::ordered_json trace = {{"traceEvents", std::move(events)},
                                  {"displayTimeUnit", "ms"},
                                  {"otherData", {{"producer", "ktune"}, {"rank", rank}}}};
  return trace.dump(1);
}

std::string key_averages_table(const std::vector<trace::SpanRecord>& spans) {
  struct Row {
    int64_t calls = 0, total_ns = 0;
  };
  std::map<std::string, Row> rows;
  int64_t steps_ns = 0;
  for (const trace::SpanRecord& s : spans) {
    Row& r = rows[s.category + " | " + s.name];
    ++r.calls;
    r.total_ns += s.duration_ns;
    if (s.category == "step") steps_ns += s.duration_ns;
  }
  std::vector<std::pair<std::string, Row>> sorted(rows.begin(), rows.end());
  std::stable_sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.second.total_ns > b.second.total_ns; });
  std::string out = "category | name                                          calls    total ms     mean ms   % of steps\n";
  for (const auto& [key, r] : sorted) {
    char line[256];
    std::snprintf(line, sizeof line, "%-56s %6lld %11.3f %11.3f %11.1f\n", key.c_str(), (long long)r.calls,
                  double(r.total_ns) / 1e6, double(r.total_ns) / 1e6 / double(r.calls),
                  steps_ns > 0 ? 100.0 * double(r.total_ns) / double(steps_ns) : 0.0);
    out += line;
  }
  return out;
}

StepProfiler::StepProfiler(ProfilerOptions options, int rank) : options_(std::move(options)), rank_(rank) {
  for (const auto& [name, v] : {std::pair<const char*, int64_t>{"wait_steps", options_.wait_steps},
                                {"warmup_steps", options_.warmup_steps},
                                {"active_steps", options_.active_steps},
                                {"num_cycles", options_.num_cycles}})
    if (v < 0) throw Error(std::string("profiler.") + name, "must be >= 0, got " + std::to_string(v));
  if (options_.active_steps == 0) throw Error("profiler.active_steps", "must be at least 1 for the profiler to record a step");
  trace::take();  // nothing from before the run
}

StepProfiler::~StepProfiler() { trace::set_recording(false); }

bool StepProfiler::active(int64_t k) const {
  const int64_t cycle = options_.wait_steps + options_.warmup_steps + options_.active_steps;
  if (options_.num_cycles > 0 && k >= cycle * options_.num_cycles) return false;
  return k % cycle >= options_.wait_steps + options_.warmup_steps;
}

void StepProfiler::begin_step(int64_t k) {
  if (!active(k)) return;
  if (!recording_) {
    trace::take();
    origin_ns_ = trace::now_ns();
    recording_ = true;
  }
  trace::set_recording(true);
}

void StepProfiler::end_step(int64_t k, int64_t global_step) {
  if (!recording_) return;
  trace::set_recording(false);
  const int64_t cycle = options_.wait_steps + options_.warmup_steps + options_.active_steps;
  if ((k + 1) % cycle == 0) write(global_step);  // the cycle's last (active) step
}

const std::vector<std::string>& StepProfiler::finish(int64_t global_step) {
  if (recording_) write(global_step);
  return written_;
}

void StepProfiler::write(int64_t global_step) {
  trace::set_recording(false);
  recording_ = false;
  const std::vector<trace::SpanRecord> spans = trace::take();
  const fs::path dir = fs::path(options_.output_dir) / ("iteration_" + std::to_string(global_step));
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(dir.string(), "cannot create the profiler's folder: " + ec.message());
  const std::string stem = (dir / ("rank" + std::to_string(rank_))).string();
  for (const auto& [path, text] : {std::pair<std::string, std::string>{stem + "_trace.json", chrome_trace_json(spans, origin_ns_, rank_)},
                                   {stem + "_key_averages.txt", key_averages_table(spans)}}) {
    std::ofstream out(path, std::ios::binary);
    out << text;
    if (!out) throw Error(path, "cannot write the profiler's output");
  }
  log_info("profiler: " + std::to_string(spans.size()) + " spans of the steps to " + std::to_string(global_step) +
           " in " + dir.string());
  written_.push_back(dir.string());
}

}  // namespace ktune
