// A worker's last words, in torchelastic's error-file format. The launcher gives each worker a
// path in TORCHELASTIC_ERROR_FILE (as torchrun does); a worker that fails writes why and when
// there before it exits. The launcher reads the files to name the *first* failure — the cause —
// rather than whichever process it happened to reap first (peers that lose it in a collective
// often exit sooner than the failing rank finishes its own exit).
// It deliberately records one message and a time, not call stacks.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace ktune::dist {

// Nanoseconds since the Unix epoch (CLOCK_REALTIME, comparable across nodes to clock skew).
int64_t wall_clock_ns();

// Writes {"message": {"message": MESSAGE, "extraInfo": {"timestamp": "<s>", "timestamp_ns": "<ns>"}}}
// atomically to $TORCHELASTIC_ERROR_FILE; does nothing when the variable is unset. Never throws:
// it runs on the way out of a failing process. The first call in a process wins: a worker records
// its error where it fails, while its process group is still up (the group's closing is what makes
// the peers fail), and a later call on the way out (main's) changes nothing.
// lost_peer: the error is a collective's that a peer did not take part in (PeerLostError), the
// consequence of another rank's failure; the launcher names those after the others.
void record_worker_error(const std::string& message, bool lost_peer = false);

struct WorkerError {
  std::string message;
  int64_t time_ns = 0;     // when the worker recorded it
  bool lost_peer = false;  // record_worker_error's flag (extraInfo "lost_peer": "1")
};

// Reads an error file written by record_worker_error (or by torchelastic, whose timestamp is in
// whole seconds). Absent when the file is missing or not in that format.
std::optional<WorkerError> read_worker_error(const std::string& path);

}  // namespace ktune::dist
