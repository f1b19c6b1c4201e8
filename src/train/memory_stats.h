// Process memory as the trainer reports it ("peak_memory_rss" in the metrics): resident and peak
// resident bytes from /proc/self/status. The engine's own planned bytes come from the model.
#pragma once

#include <cstdint>

namespace ktune {

struct MemoryStats {
  int64_t rss_bytes = 0;       // VmRSS
  int64_t peak_rss_bytes = 0;  // VmHWM
};

MemoryStats read_memory_stats();

}  // namespace ktune
