// Stopping a step's process group, and the local backend's small system helpers. Whether a recorded
// process is still alive: core/process_identity.h (process_start_time, process_is_alive).
#pragma once

#include "core/process_identity.h"

namespace ktune::sdk {

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
