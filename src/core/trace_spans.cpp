// The span record (see trace_spans.h): one process-wide list under a mutex; a span is appended
// when it ends, so spans nest in the record as they nested in time.
#include "core/trace_spans.h"

#include <chrono>
#include <map>
#include <mutex>
#include <thread>

namespace ktune::trace {

namespace {

std::mutex& record_mutex() {
  static std::mutex m;
  return m;
}
std::vector<SpanRecord>& record() {
  static std::vector<SpanRecord> spans;
  return spans;
}
std::map<std::thread::id, int>& thread_ids() {
  static std::map<std::thread::id, int> ids;
  return ids;
}

}  // namespace

void set_recording(bool on) { recording_flag().store(on, std::memory_order_relaxed); }

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::vector<SpanRecord> take() {
  std::lock_guard<std::mutex> lock(record_mutex());
  std::vector<SpanRecord> out;
  out.swap(record());
  return out;
}

Span::~Span() {
  if (start_ns_ < 0 || !recording()) return;
  SpanRecord s;
  s.start_ns = start_ns_;
  s.duration_ns = now_ns() - start_ns_;
  s.category = category_;
  s.name = index_ >= 0 ? std::string(name_) + " " + std::to_string(index_) : std::string(name_);
  std::lock_guard<std::mutex> lock(record_mutex());
  auto [it, added] = thread_ids().emplace(std::this_thread::get_id(), int(thread_ids().size()));
  s.thread = it->second;
  record().push_back(std::move(s));
}

}  // namespace ktune::trace
