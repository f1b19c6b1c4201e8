// ActivationOffload: torchtune's enable_activation_offloading for the checkpointed GPU step. With
// activation checkpointing the forward keeps each layer's input (the residual stream, (B, T, C)
// bf16) for the backward's recomputation, and the final norm's: L + 1 of them on the device.
// Offloaded, they ("the inputs", numbered j: layer j's, and j = L the final norm's) share a ring of
// kSlots device buffers (input j in slot j % kSlots); each goes to pinned host memory while the
// forward runs on, and comes back one layer ahead of the backward that reads it. The copies run on
// a stream of their own and are ordered against the compute (default) stream by events only, so
// they overlap the layers' kernels:
//   forward   claim(j)    before input j is written into its slot: the compute stream waits for
//                         the slot's last copy (its previous occupant's trip out, or a trip in that
//                         no backward consumed);
//             stored(j)   after it is written: the copy stream waits for the compute stream so far,
//                         then copies input j out, if a later input will take its slot;
//   backward  acquire(j)  before input j is read: the compute stream waits for its trip back (no
//                         wait for an input that never left);
//             prefetch(j) start input j's trip back: the copy stream waits for the compute stream
//                         so far (the last reader of the slot's occupant, input j + kSlots), then
//                         copies it in.
// Inputs j + kSlots >= inputs (the last two) are never overwritten in the forward: they neither
// leave nor come back. It deliberately offloads nothing else (a recomputed layer's activations live
// one layer at a time anyway) and makes no copy it can skip; the host memory is inputs - kSlots
// inputs of B * T_max * C, input j at j * B * T_max * C.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/dtype.h"

struct CUstream_st;
struct CUevent_st;

namespace ktune::cuda {

class ActivationOffload {
 public:
  static constexpr int64_t kSlots = 2;
  // Device slots the decoder carves for `inputs` offloadable inputs, and the pinned host bytes.
  static int64_t slot_count(int64_t inputs) { return inputs < kSlots ? inputs : kSlots; }
  // Host memory for the inputs that leave (j < inputs - kSlots), elems_max each.
  static size_t host_bytes(int64_t inputs, int64_t elems_max) {
    return inputs > kSlots ? size_t((inputs - kSlots) * elems_max) * sizeof(bf16_t) : 0;
  }

  ActivationOffload() = default;
  ~ActivationOffload();
  ActivationOffload(const ActivationOffload&) = delete;
  ActivationOffload& operator=(const ActivationOffload&) = delete;

  // inputs offloadable inputs of at most elems_max bf16 each; slots: slot_count(inputs) device
  // buffers of elems_max. Allocates the pinned host memory, the copy stream and the events.
  void init(int64_t inputs, int64_t elems_max, std::vector<bf16_t*> slots);

  void claim(int64_t j);
  // keep: the backward will read input j (false for an evaluation forward: nothing is copied).
  void stored(int64_t j, int64_t elems, bool keep);
  void acquire(int64_t j);
  void prefetch(int64_t j, int64_t elems);

 private:
  bool leaves(int64_t j) const { return j + kSlots < inputs_; }  // overwritten later in the forward
  void copy_after_compute(void* dst, const void* src, int64_t elems, bool to_host, size_t slot);
  void wait_for_slot(size_t slot);  // the compute stream waits for the slot's last copy, if any is pending

  int64_t inputs_ = 0, elems_max_ = 0;
  std::vector<bf16_t*> slots_;
  std::vector<int64_t> holds_;      // per slot: the input it holds, or will once its copy lands (-1: none)
  std::vector<bool> copy_pending_;  // per slot: a copy the compute stream has not waited for
  std::vector<bool> on_host_;       // per input: copied out in this forward
  bf16_t* host_ = nullptr;          // (inputs - kSlots, elems_max) pinned; nullptr when none leaves
  CUstream_st* copies_ = nullptr;
  std::vector<CUevent_st*> copied_;  // per slot: recorded on the copy stream after its last copy
  CUevent_st* compute_mark_ = nullptr;  // recorded on the compute stream for the copy stream to wait for
};

}  // namespace ktune::cuda
