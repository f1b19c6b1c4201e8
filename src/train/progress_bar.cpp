#include "train/progress_bar.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>

namespace ktune {

std::string format_interval(double seconds) {
  int64_t total = int64_t(std::llround(std::max(0.0, seconds)));
  int64_t h = total / 3600, m = (total / 60) % 60, s = total % 60;
  char buffer[32];
  if (h > 0)
    std::snprintf(buffer, sizeof buffer, "%lld:%02lld:%02lld", (long long)h, (long long)m, (long long)s);
  else
    std::snprintf(buffer, sizeof buffer, "%02lld:%02lld", (long long)m, (long long)s);
  return buffer;
}

static std::string render_bar(double fraction, int width) {
  static const char* kPartial[] = {"", "▏", "▎", "▍", "▌", "▋", "▊", "▉"};
  double cells = std::clamp(fraction, 0.0, 1.0) * width;
  int full = int(cells);
  int partial = int((cells - full) * 8);
  std::string bar;
  for (int i = 0; i < full; ++i) bar += "█";
  int used = full;
  if (full < width) {
    bar += partial > 0 ? kPartial[partial] : " ";
    ++used;
  }
  for (; used < width; ++used) bar += " ";
  return bar;
}

std::string render_progress(int64_t epoch_1based, int64_t global_step, double loss, int64_t done, int64_t total,
                            double elapsed_seconds) {
  double fraction = total > 0 ? double(done) / double(total) : 0.0;
  double rate = elapsed_seconds > 0 ? double(done) / elapsed_seconds : 0.0;
  std::string remaining = rate > 0 ? format_interval(double(total - done) / rate) : "?";
  char head[96], tail[128];
  std::snprintf(head, sizeof head, "%lld|%lld|Loss: %.4f: %3.0f%%|", (long long)epoch_1based, (long long)global_step,
                loss, std::floor(fraction * 100));
  std::snprintf(tail, sizeof tail, "| %lld/%lld [%s<%s, %5.2fit/s]", (long long)done, (long long)total,
                format_interval(elapsed_seconds).c_str(), remaining.c_str(), rate);
  return std::string(head) + render_bar(fraction, 10) + tail;
}

bool ProgressBar::is_terminal(std::FILE* out) { return isatty(fileno(out)) == 1; }

ProgressBar::ProgressBar(std::FILE* out, bool interactive, int64_t total)
    : out_(out), interactive_(interactive), total_(total) {}

void ProgressBar::reset(int64_t total) {
  finish();
  total_ = total;
}

void ProgressBar::update(int64_t epoch_1based, int64_t global_step, double loss, int64_t done, double elapsed_seconds) {
  std::string text = render_progress(epoch_1based, global_step, loss, done, total_, elapsed_seconds);
  if (interactive_) {
    std::fprintf(out_, "\r%s", text.c_str());
    drawn_ = true;
  } else {
    std::fprintf(out_, "%s\n", text.c_str());
  }
  std::fflush(out_);
}

void ProgressBar::finish() {
  if (interactive_ && drawn_) std::fprintf(out_, "\n");
  drawn_ = false;
  std::fflush(out_);
}

}  // namespace ktune
