#include "train/memory_stats.h"

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

}  // namespace ktune
