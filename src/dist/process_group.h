// Process groups: the collectives that data parallelism needs, behind one interface.
// GlooProcessGroup runs them over Gloo's TCP transport on the CPU (rendezvous through TcpStore);
// NcclProcessGroup (cuda/process_group_nccl.h, the CUDA backend's part of this layer) runs them over
// NCCL on GPUs. SingleProcessGroup is the
// world of one, where every collective is the identity, so recipes need no special case.
// Sums are element-wise over ranks; buffers are f32 unless the name says otherwise.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "core/error.h"

namespace ktune::dist {

class TcpStore;

// A collective that failed because a peer did not take part (it died or hung, or the network
// broke): on a rank whose peer failed first, the consequence, not the cause. The launcher names such
// failures after the others.
class PeerLostError : public Error {
 public:
  using Error::Error;
};

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // data (n) ← Σ_ranks data
  virtual void allreduce_sum(float* data, int64_t n) = 0;
  virtual void allreduce_sum(double* data, int64_t n) = 0;
  // out (n_per_rank) ← Σ_ranks in[rank*n_per_rank : (rank+1)*n_per_rank]; in (size*n_per_rank) is scratch afterwards
  virtual void reduce_scatter_sum(float* out, float* in, int64_t n_per_rank) = 0;
  // out (size*n_per_rank) ← concat_ranks in (n_per_rank)
  virtual void all_gather(float* out, const float* in, int64_t n_per_rank) = 0;
  // out (size*bytes_per_rank) ← concat_ranks in (bytes_per_rank): any dtype (bf16 shards), bit for bit
  virtual void all_gather_bytes(void* out, const void* in, int64_t bytes_per_rank) = 0;
  // data (n) ← root's data
  virtual void broadcast(float* data, int64_t n, int root) = 0;
  virtual void barrier() = 0;
};

class SingleProcessGroup final : public ProcessGroup {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void allreduce_sum(float*, int64_t) override {}
  void allreduce_sum(double*, int64_t) override {}
  void reduce_scatter_sum(float* out, float* in, int64_t n_per_rank) override;
  void all_gather(float* out, const float* in, int64_t n_per_rank) override;
  void all_gather_bytes(void* out, const void* in, int64_t bytes_per_rank) override;
  void broadcast(float*, int64_t, int) override {}
  void barrier() override {}
};

// Joins the group `prefix` of `size` ranks through the store; every rank calls it with the same
// prefix. hostname: the address peers reach this process at ("" = this host's name).
std::unique_ptr<ProcessGroup> make_gloo_process_group(TcpStore& store, const std::string& prefix, int rank, int size,
                                                      const std::string& hostname,
                                                      std::chrono::milliseconds timeout = std::chrono::seconds(300));

}  // namespace ktune::dist
