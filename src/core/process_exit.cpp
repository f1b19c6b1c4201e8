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
  if (WTERMSIG(wait_status) == SIGKILL && !sent_by_parent)
    text += std::string(" (not by its parent: the kernel's out-of-memory killer sends SIGKILL when memory runs out") +
            (usage != nullptr ? "; its peak resident memory was " + gib_text(double(usage->ru_maxrss) * 1024.0) +
                                    ", of " + gib_text(memory_limit_bytes()) + " this machine allows"
                              : std::string()) +
            ")";
  return text;
}

}  // namespace ktune
