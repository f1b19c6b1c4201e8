// Training progress as the job status shows it: the contract between a trainer and the backends,
// and the reader that turns the trainer's reports into progress %, an ETA and the latest metrics
// (upstream's trainerStatus{progressPercentage, estimatedRemainingSeconds, metrics[]}, which its
// local backends never fill). It deliberately does not write progress: the trainer does.
//
// THE CONTRACT (trainer side)
//   The local backend sets, for every node step, the environment variable
//       KTUNE_PROGRESS_FILE=<absolute path>          (one file per node: progress/node-<rank>.jsonl)
//   A trainer that sees it appends one JSON object per optimizer step (or every few steps), each
//   on its own line terminated by '\n', written with a single write() so that a reader never sees
//   half a line followed by another writer's bytes:
//       {"step":N,"total_steps":M,"epoch":E,"loss":x,"lr":y,"tokens_per_second":z,"time":t}
//   - step: optimizer steps done so far (1-based after the first step); total_steps: the planned
//     total over all epochs (0 or absent when unknown); epoch: 0-based epoch index (may be
//     fractional); time: unix seconds as a float (optional; when present the ETA uses the rate
//     between the first and the latest line instead of the time since the node started).
//   - Any other numeric key (e.g. "grad_norm", "peak_memory_gb") is kept as a metric.
//   - Only global rank 0 of a node writes its node's file; the job shows node-0's file.
//   - The file is append-only; a reader takes the last complete, valid line and ignores a
//     trailing partial line and lines that are not JSON objects.
#pragma once

#include <map>
#include <optional>
#include <string>

namespace ktune::sdk {

inline constexpr const char* kProgressFileEnv = "KTUNE_PROGRESS_FILE";

// One line of the progress file.
struct ProgressReport {
  long step = 0;
  long total_steps = 0;
  double epoch = 0;
  std::optional<double> time;               // unix seconds, when the trainer wrote it
  std::map<std::string, double> metrics;    // loss, lr, tokens_per_second and any other numbers
};

// What get_job shows.
struct JobProgress {
  bool present = false;                     // false: the trainer has reported nothing (yet)
  long step = 0;
  long total_steps = 0;
  double epoch = 0;
  double progress_percentage = -1;          // 0..100; -1 when total_steps is unknown
  double estimated_remaining_seconds = -1;  // -1 when it cannot be estimated
  std::map<std::string, double> metrics;    // latest values: loss, lr, tokens_per_second, ...
  std::string to_json() const;
  static JobProgress from_json(const std::string& json);  // "" or malformed -> not present
};

// Parses one line of the contract; nullopt for anything that is not a JSON object with "step".
std::optional<ProgressReport> parse_progress_line(const std::string& line);

// Reads a progress file: its first and latest valid lines (nullopt if the file is missing or holds
// no valid line). Reads only the head and the tail, so a long run's file costs the same to read.
struct ProgressSpan {
  ProgressReport first;
  ProgressReport latest;
};
std::optional<ProgressSpan> read_progress_file(const std::string& path);

// Combines the reports with the node's start time into percent and ETA. `now` and `started_at`
// are unix seconds; `finished` (the node step completed) makes the ETA 0.
JobProgress summarize_progress(const ProgressSpan& span, double started_at, double now, bool finished);

}  // namespace ktune::sdk
