// How a child process ended, in words, for the launcher's and the job supervisor's reports. A
// SIGKILL that the parent did not send is most often the kernel's out-of-memory killer: the words
// say so, with the child's peak resident memory (from wait4's rusage) against the memory this
// machine, or its cgroup, allows; unless that peak was under kOomSuspectFraction of it (the killer
// takes the process holding the most), when the words say another process's kill -9 is likelier.
#pragma once

#include <sys/resource.h>

#include <string>

namespace ktune {

inline constexpr double kOomSuspectFraction = 0.25;

// "exited with code N", "was killed by signal NAME" (+ the out-of-memory hint, above, when the
// signal is SIGKILL and !sent_by_parent), or "stopped". usage: the child's, or nullptr.
std::string describe_process_exit(int wait_status, const struct rusage* usage, bool sent_by_parent);

// Bytes of memory this process may use: the machine's, or its cgroup's limit where lower (v2, v1).
double memory_limit_bytes();

}  // namespace ktune
