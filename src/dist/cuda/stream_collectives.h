// Stream-ordered collectives: the CUDA side of a GPU process group, for work that overlaps the
// collectives with the compute (ZeRO-3's prefetched weight gathers, ZeRO-2's gradient reduce-scatters
// during the backward, src/train/cuda). A collective is
// enqueued on the group's own stream behind an event the caller recorded on its stream, and records
// an event behind itself that the caller's stream waits for (cudaStreamWaitEvent) before it reads the
// result: the host never waits for it. Kept out of dist::ProcessGroup, which the CPU's Gloo group
// implements too (no CUDA types there); NcclProcessGroup (process_group_nccl.cpp) implements both.
//
// The dead-peer guarantee of the blocking collectives holds through wait_enqueued(): it polls the
// group's stream with the group's timeout and aborts the communicator on a peer's failure, so a
// caller that calls it before any host synchronisation that may depend on an enqueued collective
// (cudaDeviceSynchronize, a copy to the host) ends in an Error naming the collective, not in a hang.
// It deliberately has no CUDA header: the events are CUevent_st* (cudaEvent_t's pointee).
#pragma once

#include <cstdint>

#include "dist/process_group.h"

struct CUevent_st;

namespace ktune::dist {

class StreamCollectives {
 public:
  virtual ~StreamCollectives() = default;
  // On the group's stream, behind `ready`: data (size * bytes_per_rank) ← concat_ranks of each rank's
  // data[rank * bytes_per_rank, (rank + 1) * bytes_per_rank) (an in-place all-gather of any dtype, bit
  // for bit); then `done` recorded there. Returns once it is enqueued, not done.
  virtual void enqueue_all_gather_bytes_in_place(void* data, int64_t bytes_per_rank, CUevent_st* ready,
                                                 CUevent_st* done) = 0;
  // On the group's stream, behind `ready`: data[rank * n_per_rank, (rank + 1) * n_per_rank) ← the sum
  // over the ranks of each rank's data at those elements (an in-place f32 sum reduce-scatter of
  // size * n_per_rank floats, NCCL's in-place layout; the rest of data is left as NCCL leaves it);
  // then `done` recorded there. Returns once it is enqueued, not done.
  virtual void enqueue_reduce_scatter_sum_in_place(float* data, int64_t n_per_rank, CUevent_st* ready,
                                                   CUevent_st* done) = 0;
  // Returns once everything enqueued on the group's stream has completed; throws an Error naming the
  // group and the pending collective (and aborts the communicator) on a peer's failure or after the
  // group's timeout.
  virtual void wait_enqueued() = 0;
};

// group's stream-ordered side, or nullptr when it has none (a Gloo group, a world of one).
inline StreamCollectives* stream_collectives(ProcessGroup* group) { return dynamic_cast<StreamCollectives*>(group); }

}  // namespace ktune::dist
