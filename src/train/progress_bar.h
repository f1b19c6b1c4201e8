// The training progress display. On a terminal, one line redrawn in place, as torchtune's tqdm bar:
//   1|52|Loss: 2.3697:   0%|▏         | 52/25880 [00:24<3:55:01,  1.83it/s]
// Elsewhere (a pipe, a log file, a pod), the same text as plain lines, one a logged step, so that
// logs stay readable. Time comes from the caller, so the rendering is testable.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace ktune {

// "00:24", "3:55:01" (tqdm's interval format)
std::string format_interval(double seconds);

// The bar's text for the given state (no carriage return, no newline).
std::string render_progress(int64_t epoch_1based, int64_t global_step, double loss, int64_t done, int64_t total,
                            double elapsed_seconds);

class ProgressBar {
 public:
  // out: where to draw; interactive: redraw in place (a terminal) or print plain lines.
  ProgressBar(std::FILE* out, bool interactive, int64_t total);
  static bool is_terminal(std::FILE* out);

  void reset(int64_t total);  // a new epoch
  void update(int64_t epoch_1based, int64_t global_step, double loss, int64_t done, double elapsed_seconds);
  void finish();

 private:
  std::FILE* out_;
  bool interactive_;
  int64_t total_;
  bool drawn_ = false;
};

}  // namespace ktune
