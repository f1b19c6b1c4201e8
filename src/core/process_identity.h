// Telling whether a process is still the same live process. A pid alone is not an identity: after a
// crash the kernel may give the pid to an unrelated process, so a recorded pid is paired with its
// start time (/proc/<pid>/stat field 22, clock ticks since boot). Used by the local backend's job
// registry and by the checkpointer's recovery of interrupted saves. Linux only, deliberately.
#pragma once

#include <string>

namespace ktune {

// The fields of /proc/<pid>/stat that are used.
struct ProcStat {
  char state = 0;            // field 3: R, S, D, T, Z, X, ...
  long process_group = 0;    // field 5
  long long start_time = 0;  // field 22, clock ticks since boot
};

// /proc/<pid>/stat's fields, or false when the process is gone (or the file unreadable).
bool read_proc_stat(const std::string& pid, ProcStat* stat);
bool is_zombie_or_dead(char state);

// Start time of a live process, or 0 if there is none (a zombie counts as gone).
long long process_start_time(int pid);

// True when `pid` is alive and started at `start_time` (a start_time of 0 skips that check).
bool process_is_alive(int pid, long long start_time);

}  // namespace ktune
