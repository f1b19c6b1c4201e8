// NcclProcessGroup: the ProcessGroup interface over NCCL (in the CUDA toolkit), for the CUDA
// backend. Buffers are DEVICE pointers (cudaMalloc'd or managed memory) on the device this process
// selected with cudaSetDevice before make_nccl_process_group — one GPU per rank, as NCCL requires.
// Rank 0 makes the NCCL unique id and shares it through the launcher's TcpStore. Every collective
// of the ProcessGroup interface is enqueued on the group's stream and waited for before returning
// (the Gloo group's blocking semantics); the wait polls ncclCommGetAsyncError and aborts the
// communicator on a peer's failure or after the timeout, so a dead peer ends in an Error, not a hang
// (what torch's watchdog does). The StreamCollectives side (stream_collectives.h: the in-place
// all-gather and the in-place f32 sum reduce-scatter) enqueues on the same stream behind the
// caller's event and returns at once; wait_enqueued() is the same poll, and
// every blocking collective waits for what was enqueued before it too (one stream, in order).
//
// Compiled by its users, not into ktune_dist (process_group_nccl.h): with KTUNE_HAS_NCCL where the
// CUDA toolkit and NCCL are found (the `ktune_nccl` target), otherwise make_nccl_process_group says
// the build has none. UNTESTED on a GPU: none was available when it was
// written; it compiles and links against CUDA 13's NCCL 2.28. CI runs it, 2 and 3 ranks, over the
// host emulator's fake NCCL (tests/kernels/cuda/emulator/fake/nccl.h, ktune_nccl_emulated_tests).
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "dist/cuda/process_group_nccl.h"
#include "dist/cuda/stream_collectives.h"

#ifdef KTUNE_HAS_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#endif

namespace ktune::dist {

#ifdef KTUNE_HAS_NCCL
namespace {

class NcclProcessGroup final : public ProcessGroup, public StreamCollectives {
 public:
  NcclProcessGroup(TcpStore& store, const std::string& prefix, int rank, int size, std::chrono::milliseconds timeout)
      : rank_(rank), size_(size), timeout_(timeout) {
    where_ = "NCCL process group '" + prefix + "' rank " + std::to_string(rank) + " of " + std::to_string(size);
    ncclUniqueId id;
    const std::string key = prefix + "/nccl_unique_id";
    if (rank == 0) {
      nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
      store.set(key, Bytes(reinterpret_cast<const char*>(&id), reinterpret_cast<const char*>(&id) + sizeof id));
    } else {
      Bytes b = store.get(key);
      check(b.size() == sizeof id, where_, "the unique id in the store has " + std::to_string(b.size()) + " bytes");
      std::memcpy(&id, b.data(), sizeof id);
    }
    cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    cuda(cudaMalloc(&scratch_, sizeof(float)), "cudaMalloc");
    // Non-blocking init, so that a peer that never arrives ends in a timeout.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    nccl(ncclCommInitRankConfig(&comm_, size, id, rank, &config), "ncclCommInitRankConfig");
    wait_comm_ready("ncclCommInitRank");
  }

  ~NcclProcessGroup() override {
    if (comm_) ncclCommDestroy(comm_);
    if (scratch_) cudaFree(scratch_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void allreduce_sum(float* data, int64_t n) override {
    if (n == 0) return;
    run("allreduce", ncclAllReduce(data, data, size_t(n), ncclFloat, ncclSum, comm_, stream_));
  }
  void allreduce_sum(double* data, int64_t n) override {
    if (n == 0) return;
    run("allreduce", ncclAllReduce(data, data, size_t(n), ncclDouble, ncclSum, comm_, stream_));
  }

  void reduce_scatter_sum(float* out, float* in, int64_t n_per_rank) override {
    // NCCL allows in place only as recv = send + rank·count; reduce there, then move the result.
    float* own = in + int64_t(rank_) * n_per_rank;
    run("reduce_scatter", ncclReduceScatter(in, own, size_t(n_per_rank), ncclFloat, ncclSum, comm_, stream_));
    if (out != own) {
      const size_t bytes = size_t(n_per_rank) * sizeof(float);
      const bool overlap = out < own + n_per_rank && own < out + n_per_rank;
      if (!overlap) {
        cuda(cudaMemcpyAsync(out, own, bytes, cudaMemcpyDeviceToDevice, stream_), "cudaMemcpyAsync");
      } else {  // cudaMemcpy is undefined on overlapping ranges: through a temporary
        void* tmp = nullptr;
        cuda(cudaMallocAsync(&tmp, bytes, stream_), "cudaMallocAsync");
        cuda(cudaMemcpyAsync(tmp, own, bytes, cudaMemcpyDeviceToDevice, stream_), "cudaMemcpyAsync");
        cuda(cudaMemcpyAsync(out, tmp, bytes, cudaMemcpyDeviceToDevice, stream_), "cudaMemcpyAsync");
        cuda(cudaFreeAsync(tmp, stream_), "cudaFreeAsync");
      }
      wait("reduce_scatter");
    }
  }

  void all_gather(float* out, const float* in, int64_t n_per_rank) override {
    run("all_gather", ncclAllGather(in, out, size_t(n_per_rank), ncclFloat, comm_, stream_));
  }

  void all_gather_bytes(void* out, const void* in, int64_t bytes_per_rank) override {
    run("all_gather", ncclAllGather(in, out, size_t(bytes_per_rank), ncclUint8, comm_, stream_));
  }

  void broadcast(float* data, int64_t n, int root) override {
    run("broadcast", ncclBroadcast(data, data, size_t(n), ncclFloat, root, comm_, stream_));
  }

  void barrier() override {
    run("barrier", ncclAllReduce(scratch_, scratch_, 1, ncclFloat, ncclSum, comm_, stream_));
  }

  // Streams: the caller recorded `ready` on its stream; the group's stream waits for it, runs the
  // all-gather and records `done`, which the caller's stream waits for. The host waits only until
  // NCCL has put the collective on the stream (a non-blocking communicator may still be enqueuing
  // it when ncclAllGather returns: `done` must be recorded behind it, not before it).
  void enqueue_all_gather_bytes_in_place(void* data, int64_t bytes_per_rank, CUevent_st* ready,
                                         CUevent_st* done) override {
    const char* what = "all_gather (prefetched)";
    cuda(cudaStreamWaitEvent(stream_, ready, 0), "cudaStreamWaitEvent");
    const void* own = static_cast<const char*>(data) + int64_t(rank_) * bytes_per_rank;
    nccl(ncclAllGather(own, data, size_t(bytes_per_rank), ncclUint8, comm_, stream_), what);
    wait_comm_ready(what);
    cuda(cudaEventRecord(done, stream_), "cudaEventRecord");
    enqueued_ = what;
  }

  // The same for the in-place reduce-scatter (NCCL's in-place layout: recv = send + rank * count).
  void enqueue_reduce_scatter_sum_in_place(float* data, int64_t n_per_rank, CUevent_st* ready,
                                           CUevent_st* done) override {
    const char* what = "reduce_scatter (stream-ordered)";
    cuda(cudaStreamWaitEvent(stream_, ready, 0), "cudaStreamWaitEvent");
    nccl(ncclReduceScatter(data, data + int64_t(rank_) * n_per_rank, size_t(n_per_rank), ncclFloat, ncclSum, comm_,
                           stream_),
         what);
    wait_comm_ready(what);
    cuda(cudaEventRecord(done, stream_), "cudaEventRecord");
    enqueued_ = what;
  }

  void wait_enqueued() override {
    if (enqueued_) wait(enqueued_);
  }

 private:
  void cuda(cudaError_t e, const char* what) {
    if (e != cudaSuccess) throw Error(where_, std::string(what) + ": " + cudaGetErrorString(e));
  }
  void nccl(ncclResult_t r, const char* what) {
    if (r != ncclSuccess && r != ncclInProgress) throw Error(where_, std::string(what) + ": " + ncclGetErrorString(r));
  }

  void wait_comm_ready(const char* what) {
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    for (;;) {
      ncclResult_t state = ncclSuccess;
      nccl(ncclCommGetAsyncError(comm_, &state), "ncclCommGetAsyncError");
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) abort_with(what, ncclGetErrorString(state));
      if (std::chrono::steady_clock::now() > deadline) abort_with(what, "timed out");
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

  // Enqueued collective: check the launch, then wait for the stream. A non-blocking communicator
  // may answer ncclInProgress before the collective is on the stream at all (NCCL's non-blocking
  // mode): until its state leaves ncclInProgress, an idle stream says nothing.
  void run(const char* what, ncclResult_t launched) {
    nccl(launched, what);
    wait_comm_ready(what);
    wait(what);
  }

  // The stream idle: everything enqueued on it (this collective and any before it) has completed.
  void wait(const char* what) {
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    for (;;) {
      cudaError_t e = cudaStreamQuery(stream_);
      if (e == cudaSuccess) {
        enqueued_ = nullptr;
        return;
      }
      if (e != cudaErrorNotReady) throw Error(where_, std::string(what) + ": " + cudaGetErrorString(e));
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(comm_, &state);
      if (state != ncclSuccess && state != ncclInProgress)
        abort_with(what, std::string("a peer failed or the network broke: ") + ncclGetErrorString(state));
      if (std::chrono::steady_clock::now() > deadline)
        abort_with(what, "timed out waiting for the peers (" + std::to_string(timeout_.count()) +
                             " ms, the collectives' timeout: env KTUNE_COLLECTIVE_TIMEOUT)");
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  [[noreturn]] void abort_with(const char* what, const std::string& why) {
    ncclCommAbort(comm_);
    comm_ = nullptr;
    throw PeerLostError(where_, std::string(what) + ": " + why);
  }

  int rank_, size_;
  std::chrono::milliseconds timeout_;
  std::string where_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  float* scratch_ = nullptr;
  const char* enqueued_ = nullptr;  // the last stream-ordered collective not yet waited for (nullptr: none;
                                    // a poll's Error names it, though an earlier one may be what hangs)
};

}  // namespace

std::unique_ptr<ProcessGroup> make_nccl_process_group(TcpStore& store, const std::string& prefix, int rank, int size,
                                                      std::chrono::milliseconds timeout) {
  return std::make_unique<NcclProcessGroup>(store, prefix, rank, size, timeout);
}

bool nccl_available() { return true; }

#else

std::unique_ptr<ProcessGroup> make_nccl_process_group(TcpStore&, const std::string& prefix, int rank, int,
                                                      std::chrono::milliseconds) {
  throw Error("NCCL process group '" + prefix + "' rank " + std::to_string(rank),
              "this build has no NCCL (configure with -DKTUNE_CUDA=ON or -DKTUNE_NCCL=ON where the CUDA toolkit and "
              "NCCL are installed)");
}

bool nccl_available() { return false; }

#endif

}  // namespace ktune::dist
