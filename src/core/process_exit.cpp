#include "core/process_exit.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>

namespace ktune {

namespace {

std::string gib_text(double bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f GiB", bytes / double(int64_t(1) << 30));
  return text;
}

}  // namespace

double memory_limit_bytes() {
  double limit = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
  for (const char* file : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::FILE* f = std::fopen(file, "r");
    if (f == nullptr) continue;
    double value = 0;
    if (std::fscanf(f, "%lf", &value) == 1 && value > 0 && value < limit) limit = value;  // "max" reads as nothing
    std::fclose(f);
  }
  return limit;
}

std::string describe_process_exit(int wait_status, const struct rusage* usage, bool sent_by_parent) {
  if (WIFEXITED(wait_status)) return "exited with code " + std::to_string(WEXITSTATUS(wait_status));
  if (!WIFSIGNALED(wait_status)) return "stopped";
  std::string text = std::string("was killed by signal ") + strsignal(WTERMSIG(wait_status));
  if (WTERMSIG(wait_status) != SIGKILL || sent_by_parent) return text;
  if (usage == nullptr)
    return text + " (not by its parent: the kernel's out-of-memory killer sends SIGKILL when memory runs out)";
  // The out-of-memory killer picks the process that holds the most memory: one that peaked far below
  // the limit was more likely killed by someone (kill -9) than by it.
  const double peak = double(usage->ru_maxrss) * 1024.0, limit = memory_limit_bytes();
  const std::string memory = "its peak resident memory was " + gib_text(peak) + ", of " + gib_text(limit) +
                             " this machine allows";
  if (peak < kOomSuspectFraction * limit)
    return text + " (not by its parent, and hardly by the out-of-memory killer: " + memory +
           "; another process's kill -9?)";
  return text + " (not by its parent: the kernel's out-of-memory killer sends SIGKILL when memory runs out; " + memory +
         ")";
}

}  // namespace ktune
