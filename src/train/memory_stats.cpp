#include "train/memory_stats.h"

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

namespace ktune {

MemoryStats read_memory_stats() {
  MemoryStats stats;
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    std::istringstream fields(line);
    std::string key;
    int64_t kib = 0;
    fields >> key >> kib;
    if (key == "VmRSS:") stats.rss_bytes = kib * 1024;
    if (key == "VmHWM:") stats.peak_rss_bytes = kib * 1024;
  }
  return stats;
}

double TrainingStateBytes::bytes_per_trainable() const {
  return trainable_elements ? double(weights + gradients + optimizer) / double(trainable_elements) : 0.0;
}

std::string TrainingStateBytes::str() const {
  auto mib = [](int64_t b) { return double(b) / (1 << 20); };
  char text[256];
  std::snprintf(text, sizeof text,
                "weights %.2f MiB + gradients %.2f MiB + AdamW state %.2f MiB (%.1f bytes per trainable parameter); "
                "frozen %.2f MiB",
                mib(weights), mib(gradients), mib(optimizer), bytes_per_trainable(), mib(frozen));
  return text;
}

TrainingStateBytes training_state_bytes(const std::vector<model::Parameter*>& params, int64_t optimizer_bytes) {
  TrainingStateBytes b;
  b.optimizer = optimizer_bytes;
  for (const model::Parameter* p : params) {
    if (!p->value.defined()) continue;
    if (p->trainable) {
      b.trainable_elements += p->value.numel();
      b.weights += int64_t(p->value.bytes());
      if (p->grad.defined()) b.gradients += int64_t(p->grad.bytes());
    } else {
      b.frozen += int64_t(p->value.bytes());
    }
  }
  return b;
}

}  // namespace ktune
