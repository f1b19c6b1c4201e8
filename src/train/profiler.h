// torchtune's `profiler` component (training.setup_torch_profiler) on ktune's engine: on a schedule
// of steps (wait_steps, warmup_steps, active_steps, repeated num_cycles times, torchtune's defaults
// 5, 5, 2 and 1 for those not given), the active steps' spans (core/trace_spans.h: each step and its
// phases, every layer's forward and backward, the fused output projection + loss) are written, at
// the end of each cycle, as torch.profiler's trace handler names its files:
//   <output_dir>/iteration_<step>/rank<r>_trace.json        Chrome trace (chrome://tracing, Perfetto)
//   <output_dir>/iteration_<step>/rank<r>_key_averages.txt  per span name: calls, total, mean, share
// Deliberately not here: torch's operator-level events, memory timelines, stacks, shapes and FLOP
// counts (profile_memory, with_stack, record_shapes, with_flops are accepted and said to be ignored).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/trace_spans.h"

namespace ktune {

struct ProfilerOptions {
  std::string output_dir;  // profiler.output_dir
  int64_t wait_steps = 5;
  int64_t warmup_steps = 5;
  int64_t active_steps = 2;
  int64_t num_cycles = 1;  // 0: every cycle until the run ends
};

// The Chrome trace of `spans` (JSON: {"traceEvents": [complete events "X", ts/dur in us], ...}),
// times from `origin_ns`, pid `rank`.
std::string chrome_trace_json(const std::vector<trace::SpanRecord>& spans, int64_t origin_ns, int rank);
// The key averages table: one row per span name (category and name), by total time.
std::string key_averages_table(const std::vector<trace::SpanRecord>& spans);

class StepProfiler {
 public:
  StepProfiler(ProfilerOptions options, int rank);
  ~StepProfiler();  // stops recording (what an unfinished cycle recorded is written by finish())

  // Before the run's k-th step (0-based within this run): starts recording for an active step.
  void begin_step(int64_t k);
  // After it; `global_step` names the iteration folder when a cycle's last active step ends.
  void end_step(int64_t k, int64_t global_step);
  // The run ends: writes an active window cut short, if any. Returns the folders written so far.
  const std::vector<std::string>& finish(int64_t global_step);

 private:
  bool active(int64_t k) const;
  void write(int64_t global_step);

  ProfilerOptions options_;
  int rank_;
  bool recording_ = false;
  int64_t origin_ns_ = 0;
  std::vector<std::string> written_;
};

}  // namespace ktune
