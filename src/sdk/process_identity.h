// Telling whether a process recorded in the job registry is still the same live process, and
// stopping a step's process group. A pid alone is not an identity: after a crash the kernel may
// give the pid to an unrelated process, so every recorded pid is paired with its start time
// (/proc/<pid>/stat field 22, clock ticks since boot). Linux only, deliberately.
#pragma once

namespace ktune::sdk {

// Start time of a live process, or 0 if there is none (a zombie counts as gone).
long long process_start_time(int pid);

// True when `pid` is alive and started at `start_time` (a start_time of 0 skips that check).
bool process_is_alive(int pid, long long start_time);

// Sends SIGTERM to the process group `pgid` (whose leader is `pid`, started at `start_time`),
// waits up to `grace_seconds` for every member to exit, then sends SIGKILL. Does nothing when
// the leader is gone and no member of the group is left, or when the leader's pid now belongs to
// another process. Returns true if it had to send SIGKILL.
bool stop_process_group(int pgid, long long start_time, double grace_seconds);

// A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, read it back).
int free_local_port();

// Unix time in seconds, with sub-second precision.
double unix_now();

}  // namespace ktune::sdk
