// ActivationOffload: see activation_offload.h. Host code only (the runtime's streams, events and
// copies); the compute stream is the default one, where the decoder runs everything else.
#include "model/cuda/activation_offload.h"

#include <cuda_runtime.h>

#include <string>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"

namespace ktune::cuda {

void ActivationOffload::init(int64_t inputs, int64_t elems_max, std::vector<bf16_t*> slots) {
  check(inputs > 0 && elems_max > 0 && int64_t(slots.size()) == slot_count(inputs), "activation offloading",
        "init with " + std::to_string(inputs) + " inputs and " + std::to_string(slots.size()) + " slots");
  inputs_ = inputs;
  elems_max_ = elems_max;
  slots_ = std::move(slots);
  holds_.assign(slots_.size(), -1);
  copy_pending_.assign(slots_.size(), false);
  on_host_.assign(size_t(inputs), false);
  if (host_bytes(inputs, elems_max) > 0) {
    void* host = nullptr;
    const size_t bytes = host_bytes(inputs, elems_max);
    if (cudaMallocHost(&host, bytes) != cudaSuccess) {
      cudaGetLastError();  // cleared: the failure is this Error
      throw Error("activation offloading", "cannot pin " + std::to_string(bytes >> 20) + " MiB of host memory for " +
                                               std::to_string(inputs - kSlots) +
                                               " layer inputs; turn enable_activation_offloading off or shorten the "
                                               "batch");
    }
    host_ = static_cast<bf16_t*>(host);
  }
  // Non-blocking: no implicit synchronisation with the (legacy) default stream the decoder runs on.
  KTUNE_CUDA_CHECK(cudaStreamCreateWithFlags(&copies_, cudaStreamNonBlocking));
  copied_.assign(slots_.size(), nullptr);
  for (CUevent_st*& e : copied_) KTUNE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  KTUNE_CUDA_CHECK(cudaEventCreateWithFlags(&compute_mark_, cudaEventDisableTiming));
}

ActivationOffload::~ActivationOffload() {
  if (copies_) cudaStreamSynchronize(copies_);  // nothing in flight into memory about to be freed
  for (CUevent_st* e : copied_) cudaEventDestroy(e);
  if (compute_mark_) cudaEventDestroy(compute_mark_);
  if (copies_) cudaStreamDestroy(copies_);
  if (host_) cudaFreeHost(host_);
}

void ActivationOffload::wait_for_slot(size_t slot) {
  if (!copy_pending_[slot]) return;
  KTUNE_CUDA_CHECK(cudaStreamWaitEvent(nullptr, copied_[slot], 0));
  copy_pending_[slot] = false;
}

// One copy on the copy stream, after everything the compute stream has been given so far.
void ActivationOffload::copy_after_compute(void* dst, const void* src, int64_t elems, bool to_host, size_t slot) {
  check(elems > 0 && elems <= elems_max_, "activation offloading",
        "a copy of " + std::to_string(elems) + " elements, the slots hold " + std::to_string(elems_max_));
  KTUNE_CUDA_CHECK(cudaEventRecord(compute_mark_, nullptr));
  KTUNE_CUDA_CHECK(cudaStreamWaitEvent(copies_, compute_mark_, 0));
  KTUNE_CUDA_CHECK(cudaMemcpyAsync(dst, src, size_t(elems) * sizeof(bf16_t),
                                   to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, copies_));
  KTUNE_CUDA_CHECK(cudaEventRecord(copied_[slot], copies_));
  copy_pending_[slot] = true;
}

void ActivationOffload::claim(int64_t j) {
  const size_t slot = size_t(j % kSlots);
  wait_for_slot(slot);
  holds_[slot] = j;
  on_host_[size_t(j)] = false;
}

void ActivationOffload::stored(int64_t j, int64_t elems, bool keep) {
  const size_t slot = size_t(j % kSlots);
  check(holds_[slot] == j, "activation offloading", "input " + std::to_string(j) + " stored without its claim");
  if (!keep || !leaves(j)) return;
  copy_after_compute(host_ + j * elems_max_, slots_[slot], elems, true, slot);
  on_host_[size_t(j)] = true;
}

void ActivationOffload::acquire(int64_t j) {
  const size_t slot = size_t(j % kSlots);
  check(holds_[slot] == j, "activation offloading",
        "input " + std::to_string(j) + " read while its slot holds input " + std::to_string(holds_[slot]) +
            " (a missing prefetch)");
  wait_for_slot(slot);
}

void ActivationOffload::prefetch(int64_t j, int64_t elems) {
  const size_t slot = size_t(j % kSlots);
  if (holds_[slot] == j) return;  // never left
  check(on_host_[size_t(j)], "activation offloading",
        "a prefetch of input " + std::to_string(j) + ", which this forward did not copy out");
  copy_after_compute(slots_[slot], host_ + j * elems_max_, elems, false, slot);
  holds_[slot] = j;
}

}  // namespace ktune::cuda
