// GlooProcessGroup: ProcessGroup over Gloo (Debian's libgloo) with its TCP transport. Gloo finds
// its peers through a gloo::rendezvous::Store; ours forwards to the launcher's TcpStore.
// A peer that dies makes the next collective throw (Gloo closes the pairs): the worker exits with
// the error, and the launcher stops the job — no hang.
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "dist/process_group.h"
#include "dist/tcp_store.h"

namespace ktune::dist {

void SingleProcessGroup::reduce_scatter_sum(float* out, float* in, int64_t n_per_rank) {
  if (out != in) std::memcpy(out, in, size_t(n_per_rank) * sizeof(float));
}

void SingleProcessGroup::all_gather(float* out, const float* in, int64_t n_per_rank) {
  if (out != in) std::memcpy(out, in, size_t(n_per_rank) * sizeof(float));
}

void SingleProcessGroup::all_gather_bytes(void* out, const void* in, int64_t bytes_per_rank) {
  if (out != in) std::memcpy(out, in, size_t(bytes_per_rank));
}

namespace {

class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  explicit GlooStoreAdapter(TcpStore& store) : store_(store) {}
  void set(const std::string& key, const std::vector<char>& data) override { store_.set(key, data); }
  std::vector<char> get(const std::string& key) override { return store_.get(key); }
  void wait(const std::vector<std::string>& keys) override { store_.wait(keys); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    store_.wait(keys, timeout);
  }

 private:
  TcpStore& store_;
};

template <typename T>
void sum_into(void* c, const void* a, const void* b, size_t n) {
  T* out = static_cast<T*>(c);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = x[i] + y[i];
}

// Gloo's words (strerror's, through its pairs) for a peer whose end of a connection went away: its
// process ended, or the network between dropped it. Any other failure to connect (an address that
// does not resolve, a timeout before every peer came) is this rank's own to report.
bool peer_went_away(const std::string& what) {
  for (const char* words : {"Connection closed by peer", "Connection reset by peer", "Connection refused", "Broken pipe"})
    if (what.find(words) != std::string::npos) return true;
  return false;
}

class GlooProcessGroup final : public ProcessGroup {
 public:
  GlooProcessGroup(TcpStore& store, const std::string& prefix, int rank, int size, const std::string& hostname,
                   std::chrono::milliseconds timeout)
      : rank_(rank), size_(size), timeout_(timeout) {
    gloo::transport::tcp::attr attr;
    attr.hostname = hostname;
    if (attr.hostname.empty()) {
      char name[256] = {0};
      gethostname(name, sizeof name - 1);
      attr.hostname = name;
    }
    auto device = gloo::transport::tcp::CreateDevice(attr);
    GlooStoreAdapter adapter(store);
    gloo::rendezvous::PrefixStore prefixed(prefix, adapter);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(timeout);
    try {
      context->connectFullMesh(prefixed, device);
    } catch (const std::exception& e) {
      const std::string where = "process group '" + prefix + "' rank " + std::to_string(rank);
      if (peer_went_away(e.what()))  // a peer died while the mesh formed: it, not this rank, is the cause
        throw PeerLostError(where, std::string("cannot connect: a peer failed or the network broke: ") + e.what());
      throw Error(where, std::string("cannot connect: ") + e.what());
    }
    context_ = context;
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void allreduce_sum(float* data, int64_t n) override { allreduce(data, n); }
  void allreduce_sum(double* data, int64_t n) override { allreduce(data, n); }

  // A ring reduce-scatter on Gloo's unbound buffers (NCCL's algorithm): world-1 steps; at each, a
  // rank sends its right neighbour the chunk it summed the step before and adds the chunk coming
  // from its left into its own copy. After the last step rank r holds the sum of chunk r. Any world
  // size works, and each rank sends (world-1)/world of the buffer. (Gloo's own
  // ReduceScatterHalvingDoubling sums wrongly for world sizes that are not powers of two,
  // pytorch/gloo#303, and its last notification can still be in flight when a peer that finished
  // first closes its connection: "Connection closed by peer" on the other rank.)
  void reduce_scatter_sum(float* out, float* in, int64_t n_per_rank) override {  // in (size, n_per_rank)
    if (n_per_rank == 0) return;
    guard("reduce_scatter", [&] {
      const size_t chunk_bytes = size_t(n_per_rank) * sizeof(float);
      std::vector<float> incoming(size_t(n_per_rank), 0.0f);  // (n_per_rank,) the left neighbour's chunk
      auto outgoing_buffer = context_->createUnboundBuffer(in, chunk_bytes * size_t(size_));
      auto incoming_buffer = context_->createUnboundBuffer(incoming.data(), chunk_bytes);
      const int right = (rank_ + 1) % size_, left = (rank_ + size_ - 1) % size_;
      const uint64_t slot = gloo::Slot::build(kReduceScatterSlotPrefix, next_tag());
      for (int step = 0; step + 1 < size_; ++step) {
        const int sent_chunk = ring_index(rank_ - step - 1), received_chunk = ring_index(rank_ - step - 2);
        incoming_buffer->recv(left, slot);
        outgoing_buffer->send(right, slot, size_t(sent_chunk) * chunk_bytes, chunk_bytes);
        if (!incoming_buffer->waitRecv(timeout_)) throw Error("reduce_scatter", "the receive was aborted");
        float* summed = in + int64_t(received_chunk) * n_per_rank;
        for (int64_t i = 0; i < n_per_rank; ++i) summed[i] += incoming[size_t(i)];
        if (!outgoing_buffer->waitSend(timeout_)) throw Error("reduce_scatter", "the send was aborted");
      }
    });
    std::memmove(out, in + rank_ * n_per_rank, size_t(n_per_rank) * sizeof(float));
  }

  void all_gather(float* out, const float* in, int64_t n_per_rank) override {
    guard("all_gather", [&] {
      gloo::AllgatherOptions opts(context_);
      opts.setInput(const_cast<float*>(in), size_t(n_per_rank));
      opts.setOutput(out, size_t(n_per_rank * size_));
      opts.setTag(next_tag());
      opts.setTimeout(timeout_);
      gloo::allgather(opts);
    });
  }

  void all_gather_bytes(void* out, const void* in, int64_t bytes_per_rank) override {
    guard("all_gather", [&] {
      gloo::AllgatherOptions opts(context_);
      opts.setInput(static_cast<uint8_t*>(const_cast<void*>(in)), size_t(bytes_per_rank));
      opts.setOutput(static_cast<uint8_t*>(out), size_t(bytes_per_rank * size_));
      opts.setTag(next_tag());
      opts.setTimeout(timeout_);
      gloo::allgather(opts);
    });
  }

  void broadcast(float* data, int64_t n, int root) override {
    guard("broadcast", [&] {
      gloo::BroadcastOptions opts(context_);
      opts.setOutput(data, size_t(n));
      opts.setRoot(root);
      opts.setTag(next_tag());
      opts.setTimeout(timeout_);
      gloo::broadcast(opts);
    });
  }

  void barrier() override {
    guard("barrier", [&] {
      gloo::BarrierOptions opts(context_);
      opts.setTag(next_tag());
      opts.setTimeout(timeout_);
      gloo::barrier(opts);
    });
  }

 private:
  template <typename T>
  void allreduce(T* data, int64_t n) {
    if (n == 0) return;
    guard("allreduce", [&] {
      gloo::AllreduceOptions opts(context_);
      opts.setOutput(data, size_t(n));
      opts.setReduceFunction(gloo::AllreduceOptions::Func(&sum_into<T>));
      opts.setTag(next_tag());
      opts.setTimeout(timeout_);
      gloo::allreduce(opts);
    });
  }

  template <typename Body>
  void guard(const char* what, Body body) {
    try {
      body();
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      const std::string where = std::string(what) + " on rank " + std::to_string(rank_) + " of " + std::to_string(size_);
      if (std::string(e.what()).find("Timed out") != std::string::npos)  // gloo's words for its timeout
        throw PeerLostError(where, "a peer did not take part within the collectives' timeout of " + seconds_text(timeout_) +
                                       " (env KTUNE_COLLECTIVE_TIMEOUT): " + e.what());
      throw PeerLostError(where, std::string("a peer failed or the network broke: ") + e.what());
    }
  }

  static std::string seconds_text(std::chrono::milliseconds t) {  // "1800 s", "0.5 s"
    char text[32];
    std::snprintf(text, sizeof text, "%g s", double(t.count()) / 1000.0);
    return text;
  }

  uint32_t next_tag() { return tag_++; }
  int ring_index(int k) const { return ((k % size_) + size_) % size_; }

  // Gloo's own collectives use slot prefixes 0x01..0x08 (gloo/types.h).
  static constexpr uint8_t kReduceScatterSlotPrefix = 0x20;

  int rank_, size_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<gloo::Context> context_;
  uint32_t tag_ = 1;
};

}  // namespace

std::unique_ptr<ProcessGroup> make_gloo_process_group(TcpStore& store, const std::string& prefix, int rank, int size,
                                                      const std::string& hostname, std::chrono::milliseconds timeout) {
  return std::make_unique<GlooProcessGroup>(store, prefix, rank, size, hostname, timeout);
}

}  // namespace ktune::dist
