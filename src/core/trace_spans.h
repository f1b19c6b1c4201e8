// Named spans of time, recorded while a profiler asks for them (train/profiler.h: torchtune's
// `profiler` component) and off otherwise, where a TraceSpan costs one relaxed atomic load. The
// engine marks what a step is made of (its phases, each layer's forward and backward, the fused
// loss); the profiler writes them as a Chrome trace.
//
// Spans come from any thread (each records its own thread's id); the name is a fixed text plus an
// optional index ("layer" 3 -> "layer 3"), formatted only when recording.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace ktune::trace {

struct SpanRecord {
  std::string name;      // "layer 3"
  std::string category;  // "forward", "backward", "step", ...
  int64_t start_ns = 0;  // steady clock
  int64_t duration_ns = 0;
  int thread = 0;        // a small id per recording thread, in order of first span
};

void set_recording(bool on);
inline std::atomic<bool>& recording_flag() {
  static std::atomic<bool> flag{false};
  return flag;
}
inline bool recording() { return recording_flag().load(std::memory_order_relaxed); }
// The spans recorded since the last take(), in the order they ended; empties the record.
std::vector<SpanRecord> take();
int64_t now_ns();  // steady clock, nanoseconds

class Span {
 public:
  Span(const char* category, const char* name, int64_t index = -1)
      : category_(category), name_(name), index_(index), start_ns_(recording() ? now_ns() : -1) {}
  ~Span();
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  const char* category_;
  const char* name_;
  int64_t index_;
  int64_t start_ns_;  // -1: not recording when it began
};

}  // namespace ktune::trace
