// The NCCL process group: without NCCL in the build it says so; with NCCL but no GPU it fails with
// an Error (not a crash); with a GPU, a world of one gives each collective's identity on device
// buffers. Worlds of 2 and 3 (NcclProcessGroupRanks) run each collective against its host reference
// (in place, overlapping, large; the stream-ordered all-gather and reduce-scatter behind and before
// events, between blocking collectives), and a peer that never joins, leaves (also under an enqueued
// all-gather or reduce-scatter, found by the poll), or calls another collective ends in an Error
// naming the group, not a hang. Each rank is a process of its own: this binary
// again, running only NcclProcessGroupRank.RunsTheCaseItsParentNames (a fresh process, as CUDA and
// NCCL need; never a fork of one that used CUDA). They need a GPU per rank, or the host emulator
// (KTUNE_EMULATED_NCCL: tests/kernels/cuda/emulator's fake cuda_runtime.h and nccl.h, each process
// its own emulated device), where CI runs them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "dist/cuda/process_group_nccl.h"
#include "dist/cuda/stream_collectives.h"
#include "dist/tcp_store.h"

#ifdef KTUNE_HAS_NCCL
#include <cuda_runtime.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <thread>
#endif

using namespace ktune;
using namespace ktune::dist;
using namespace std::chrono_literals;

TEST(NcclProcessGroup, ABuildWithoutNcclSaysSoWhenAskedForOne) {
  if (nccl_available()) GTEST_SKIP() << "this build has NCCL";
  TcpStoreServer server(0);
  TcpStore store("127.0.0.1", server.port(), 10s);
  try {
    make_nccl_process_group(store, "nccl", 0, 1, 10s);
    FAIL() << "made an NCCL group without NCCL";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("-DKTUNE_NCCL=ON"), std::string::npos) << e.what();
  }
}

#ifdef KTUNE_HAS_NCCL
static bool has_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

TEST(NcclProcessGroup, WithoutAGpuMakingOneIsAnError) {
  if (has_gpu()) GTEST_SKIP() << "a GPU is present";
  TcpStoreServer server(0);
  TcpStore store("127.0.0.1", server.port(), 10s);
  EXPECT_THROW(make_nccl_process_group(store, "nccl", 0, 1, 10s), Error);
}

TEST(NcclProcessGroup, AWorldOfOneGivesEachCollectivesIdentityOnDeviceBuffers) {
  if (!has_gpu()) GTEST_SKIP() << "no GPU here";
  TcpStoreServer server(0);
  TcpStore store("127.0.0.1", server.port(), 30s);
  auto group = make_nccl_process_group(store, "nccl", 0, 1, 30s);
  std::vector<float> host(64);
  for (size_t i = 0; i < host.size(); ++i) host[i] = float(i) - 7.0f;
  float *a = nullptr, *b = nullptr;
  ASSERT_EQ(cudaMalloc(&a, host.size() * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&b, host.size() * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(a, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  group->allreduce_sum(a, 64);
  group->all_gather(b, a, 64);
  group->reduce_scatter_sum(a, b, 64);
  group->broadcast(a, 64, 0);
  group->barrier();
  std::vector<float> back(64);
  ASSERT_EQ(cudaMemcpy(back.data(), a, back.size() * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, host);
  group->all_gather_bytes(b, a, 64 * sizeof(float));
  ASSERT_EQ(cudaMemcpy(back.data(), b, back.size() * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, host);
  cudaFree(a);
  cudaFree(b);
}

// ---- worlds of several ranks, one process each ----

namespace {

// A rank's view of its case, from the environment its parent gave it.
struct RankSetup {
  std::string name;
  int rank = 0, world = 0, port = 0;
  std::chrono::milliseconds timeout{0};
};

// A device buffer of T: filled from and read back to the host.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n) : n_(n) {
    if (cudaMalloc(&data_, std::max<size_t>(n, 1) * sizeof(T)) != cudaSuccess) throw Error("cudaMalloc", "failed");
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) { upload(host); }
  ~DeviceArray() { cudaFree(data_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* data() { return data_; }
  void upload(const std::vector<T>& host) {
    if (cudaMemcpy(data_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice) != cudaSuccess)
      throw Error("cudaMemcpy", "to the device failed");
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    if (cudaMemcpy(host.data(), data_, n_ * sizeof(T), cudaMemcpyDeviceToHost) != cudaSuccess)
      throw Error("cudaMemcpy", "to the host failed");
    return host;
  }

 private:
  T* data_ = nullptr;
  size_t n_;
};

// Rank r's element i: small integers, so every sum is exact in f32 in any order (NCCL's order is
// its algorithm's).
float value(int rank, int64_t i) { return float((i * 7 + rank * 13) % 101 - 50); }
std::vector<float> values(int rank, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = value(rank, i);
  return v;
}
// Σ_ranks values(r, n)[first ...]
std::vector<float> summed(int world, int64_t first, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n), 0.0f);
  for (int r = 0; r < world; ++r)
    for (int64_t i = 0; i < n; ++i) v[size_t(i)] += value(r, first + i);
  return v;
}
std::vector<float> slice(const std::vector<float>& v, int64_t first, int64_t n) {
  return std::vector<float>(v.begin() + first, v.begin() + first + n);
}

void check_allreduce(ProcessGroup& g, int64_t n) {
  DeviceArray<float> x(values(g.rank(), n));
  g.allreduce_sum(x.data(), n);
  EXPECT_EQ(x.download(), summed(g.size(), 0, n)) << "allreduce of " << n;
}

// reduce_scatter_sum into a buffer of its own, in place (out = in + rank n: NCCL's in-place
// layout), and `shift` elements past the rank's own part (overlapping it: through a temporary).
void check_reduce_scatter(ProcessGroup& g, int64_t n, int64_t shift) {
  const int w = g.size(), r = g.rank();
  const std::vector<float> want = summed(w, int64_t(r) * n, n);
  DeviceArray<float> in(values(r, w * n));
  DeviceArray<float> out(static_cast<size_t>(n));
  g.reduce_scatter_sum(out.data(), in.data(), n);
  EXPECT_EQ(out.download(), want) << "reduce_scatter of " << n << " into its own buffer";
  in.upload(values(r, w * n));
  g.reduce_scatter_sum(in.data() + int64_t(r) * n, in.data(), n);
  EXPECT_EQ(slice(in.download(), int64_t(r) * n, n), want) << "reduce_scatter of " << n << " in place";
  std::vector<float> padded = values(r, w * n);
  padded.resize(size_t(w * n + shift), 0.0f);
  DeviceArray<float> shifted(padded);
  g.reduce_scatter_sum(shifted.data() + int64_t(r) * n + shift, shifted.data(), n);
  EXPECT_EQ(slice(shifted.download(), int64_t(r) * n + shift, n), want)
      << "reduce_scatter of " << n << " into its own part shifted by " << shift;
}

// all_gather into a buffer of its own and in place (in = out + rank n).
void check_all_gather(ProcessGroup& g, int64_t n) {
  const int w = g.size(), r = g.rank();
  std::vector<float> want;
  for (int q = 0; q < w; ++q) {
    const std::vector<float> part = values(q, n);
    want.insert(want.end(), part.begin(), part.end());
  }
  DeviceArray<float> in(values(r, n));
  DeviceArray<float> out(static_cast<size_t>(w * n));
  g.all_gather(out.data(), in.data(), n);
  EXPECT_EQ(out.download(), want) << "all_gather of " << n;
  std::vector<float> garbage(size_t(w * n), -1.0f);
  std::copy_n(values(r, n).begin(), n, garbage.begin() + int64_t(r) * n);
  DeviceArray<float> same(garbage);
  g.all_gather(same.data(), same.data() + int64_t(r) * n, n);
  EXPECT_EQ(same.download(), want) << "all_gather of " << n << " in place";
}

// all_gather_bytes of an odd byte count (no dtype's multiple), apart and in place.
void check_all_gather_bytes(ProcessGroup& g, int64_t bytes) {
  const int w = g.size(), r = g.rank();
  auto byte_of = [](int rank, int64_t i) { return uint8_t((i * 31 + rank * 101 + 7) & 0xff); };
  std::vector<uint8_t> mine(static_cast<size_t>(bytes)), want(static_cast<size_t>(w * bytes));
  for (int64_t i = 0; i < bytes; ++i) mine[size_t(i)] = byte_of(r, i);
  for (int q = 0; q < w; ++q)
    for (int64_t i = 0; i < bytes; ++i) want[size_t(q * bytes + i)] = byte_of(q, i);
  DeviceArray<uint8_t> in(mine);
  DeviceArray<uint8_t> out(static_cast<size_t>(w * bytes));
  g.all_gather_bytes(out.data(), in.data(), bytes);
  EXPECT_EQ(out.download(), want) << "all_gather_bytes of " << bytes;
  std::vector<uint8_t> garbage(size_t(w * bytes), 0xee);
  std::copy(mine.begin(), mine.end(), garbage.begin() + int64_t(r) * bytes);
  DeviceArray<uint8_t> same(garbage);
  g.all_gather_bytes(same.data(), same.data() + int64_t(r) * bytes, bytes);
  EXPECT_EQ(same.download(), want) << "all_gather_bytes of " << bytes << " in place";
}

void check_broadcast(ProcessGroup& g, int64_t n, int root) {
  DeviceArray<float> x(values(g.rank(), n));
  g.broadcast(x.data(), n, root);
  EXPECT_EQ(x.download(), values(root, n)) << "broadcast of " << n << " from " << root;
}

// The stream-ordered in-place all-gather (StreamCollectives): two enqueued back to back behind the
// default stream's events, the default stream made to wait for each before it reads the result (no
// host wait), then a blocking all-gather behind them on the group's stream, and the poll.
void check_stream_all_gather(ProcessGroup& g, int64_t bytes) {
  StreamCollectives* c = stream_collectives(&g);
  ASSERT_NE(c, nullptr) << "the NCCL group has no stream-ordered side";
  const int w = g.size(), r = g.rank();
  auto byte_of = [](int rank, int64_t i, int round) { return uint8_t((i * 13 + rank * 71 + round * 5 + 3) & 0xff); };
  std::vector<std::vector<uint8_t>> want(2, std::vector<uint8_t>(size_t(w * bytes)));
  std::vector<std::unique_ptr<DeviceArray<uint8_t>>> data;
  cudaEvent_t ready[2], done[2];
  for (int round = 0; round < 2; ++round) {
    for (int q = 0; q < w; ++q)
      for (int64_t i = 0; i < bytes; ++i) want[size_t(round)][size_t(q * bytes + i)] = byte_of(q, i, round);
    std::vector<uint8_t> mine(size_t(w * bytes), 0xee);  // the other ranks' places: garbage until gathered
    for (int64_t i = 0; i < bytes; ++i) mine[size_t(r * bytes + i)] = byte_of(r, i, round);
    data.push_back(std::make_unique<DeviceArray<uint8_t>>(mine));
    ASSERT_EQ(cudaEventCreate(&ready[round]), cudaSuccess);
    ASSERT_EQ(cudaEventCreate(&done[round]), cudaSuccess);
    ASSERT_EQ(cudaEventRecord(ready[round], nullptr), cudaSuccess);
    c->enqueue_all_gather_bytes_in_place(data.back()->data(), bytes, ready[round], done[round]);
  }
  for (int round = 0; round < 2; ++round) {
    ASSERT_EQ(cudaStreamWaitEvent(nullptr, done[round], 0), cudaSuccess);
    EXPECT_EQ(data[size_t(round)]->download(), want[size_t(round)]) << "enqueued all-gather " << round << " of " << bytes;
  }
  check_all_gather_bytes(g, bytes + 1);  // a blocking one behind them, on the same stream
  c->wait_enqueued();
  for (int round = 0; round < 2; ++round) {
    cudaEventDestroy(ready[round]);
    cudaEventDestroy(done[round]);
  }
}

// The stream-ordered in-place f32 sum reduce-scatter (StreamCollectives): behind a blocking
// allreduce, two enqueued back to back behind the default stream's events with a stream-ordered
// all-gather between them (ZeRO-3's backward issues them so), the default stream made to wait for
// each before it reads the rank's summed piece (no host wait), then a blocking reduce-scatter behind
// them on the group's stream, and the poll.
void check_stream_reduce_scatter(ProcessGroup& g, int64_t n) {
  StreamCollectives* c = stream_collectives(&g);
  ASSERT_NE(c, nullptr) << "the NCCL group has no stream-ordered side";
  const int w = g.size(), r = g.rank();
  check_allreduce(g, n + 2);  // a blocking one before them
  auto summed_round = [&](int round) {  // Σ_q values(q + 7 round) over this rank's piece
    std::vector<float> v(static_cast<size_t>(n), 0.0f);
    for (int q = 0; q < w; ++q)
      for (int64_t i = 0; i < n; ++i) v[size_t(i)] += value(q + 7 * round, int64_t(r) * n + i);
    return v;
  };
  std::vector<std::unique_ptr<DeviceArray<float>>> data;
  std::vector<uint8_t> bytes(size_t(w) * 5, 0xee), want_bytes(size_t(w) * 5);
  for (int q = 0; q < w; ++q)
    for (int i = 0; i < 5; ++i) want_bytes[size_t(q * 5 + i)] = uint8_t(q * 16 + i);
  for (int i = 0; i < 5; ++i) bytes[size_t(r * 5 + i)] = want_bytes[size_t(r * 5 + i)];
  DeviceArray<uint8_t> gathered(bytes);
  cudaEvent_t ready[3], done[3];
  for (int k = 0; k < 3; ++k) {
    ASSERT_EQ(cudaEventCreate(&ready[k]), cudaSuccess);
    ASSERT_EQ(cudaEventCreate(&done[k]), cudaSuccess);
  }
  for (int round = 0; round < 2; ++round) {
    data.push_back(std::make_unique<DeviceArray<float>>(values(r + 7 * round, int64_t(w) * n)));
    ASSERT_EQ(cudaEventRecord(ready[round], nullptr), cudaSuccess);
    c->enqueue_reduce_scatter_sum_in_place(data.back()->data(), n, ready[round], done[round]);
    if (round > 0) continue;
    ASSERT_EQ(cudaEventRecord(ready[2], nullptr), cudaSuccess);
    c->enqueue_all_gather_bytes_in_place(gathered.data(), 5, ready[2], done[2]);
  }
  for (int round = 0; round < 2; ++round) {
    ASSERT_EQ(cudaStreamWaitEvent(nullptr, done[round], 0), cudaSuccess);
    EXPECT_EQ(slice(data[size_t(round)]->download(), int64_t(r) * n, n), summed_round(round))
        << "enqueued reduce-scatter " << round << " of " << n << " a rank";
  }
  ASSERT_EQ(cudaStreamWaitEvent(nullptr, done[2], 0), cudaSuccess);
  EXPECT_EQ(gathered.download(), want_bytes) << "the all-gather enqueued between them";
  check_reduce_scatter(g, n + 1, 0);  // a blocking one behind them, on the same stream
  c->wait_enqueued();
  for (int k = 0; k < 3; ++k) {
    cudaEventDestroy(ready[k]);
    cudaEventDestroy(done[k]);
  }
}

std::unique_ptr<ProcessGroup> join(TcpStore& store, const RankSetup& s) {
  return make_nccl_process_group(store, "ranks-" + s.name, s.rank, s.world, s.timeout);
}

// What a failing case's rank must throw: an Error naming the group and one of `any_of`.
void expect_group_error(const std::function<void()>& body, const RankSetup& s,
                        const std::vector<std::string>& any_of) {
  try {
    body();
    ADD_FAILURE() << "rank " << s.rank << " returned; it should have thrown an Error saying " << any_of.front();
  } catch (const Error& e) {
    const std::string said = e.what();
    EXPECT_NE(said.find("NCCL process group 'ranks-" + s.name + "' rank " + std::to_string(s.rank) + " of " +
                        std::to_string(s.world)),
              std::string::npos)
        << said;
    EXPECT_TRUE(std::any_of(any_of.begin(), any_of.end(),
                            [&](const std::string& what) { return said.find(what) != std::string::npos; }))
        << said;
  }
}
void expect_group_error(const std::function<void()>& body, const RankSetup& s, const std::string& what) {
  expect_group_error(body, s, std::vector<std::string>{what});
}

// The last rank joins, then leaves; the others enqueue a stream-ordered collective (behind an event
// recorded on the default stream), which returns at once (nothing waits on the host), and the poll
// before a host synchronisation ends it in the group's Error naming it (`what`): the timeout (with
// three ranks the second to give up may see the first one's abort instead, a peer's failure).
void expect_enqueued_collective_fails(
    TcpStore& store, const RankSetup& s, const std::string& what,
    const std::function<void(StreamCollectives&, cudaEvent_t ready, cudaEvent_t done)>& enqueue) {
  auto g = join(store, s);
  if (s.rank == s.world - 1) return;
  cudaEvent_t ready, done;
  ASSERT_EQ(cudaEventCreate(&ready), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&done), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(ready, nullptr), cudaSuccess);
  StreamCollectives* c = stream_collectives(g.get());
  ASSERT_NE(c, nullptr);
  enqueue(*c, ready, done);
  std::vector<std::string> said = {what + "timed out waiting for the peers"};
  if (s.world > 2) said.push_back(what + "a peer failed");
  expect_group_error([&] { c->wait_enqueued(); }, s, said);
}

// The cases a rank can be told to run: every rank of the world calls the same one.
const std::map<std::string, std::function<void(TcpStore&, const RankSetup&)>>& rank_cases() {
  static const std::map<std::string, std::function<void(TcpStore&, const RankSetup&)>> cases = {
      {"allreduce",
       [](TcpStore& store, const RankSetup& s) {
         auto g = join(store, s);
         check_allreduce(*g, 1001);
         check_allreduce(*g, 1);
         g->allreduce_sum(static_cast<float*>(nullptr), 0);  // nothing to do, and no collective
         std::vector<double> host(17);
         for (size_t i = 0; i < host.size(); ++i) host[i] = 0.25 * double(i) + double(g->rank()) * 1e9;
         DeviceArray<double> x(host);
         g->allreduce_sum(x.data(), 17);
         const std::vector<double> back = x.download();
         const double ranks = double(g->size() * (g->size() - 1) / 2);
         for (size_t i = 0; i < back.size(); ++i)
           EXPECT_EQ(back[i], 0.25 * double(i) * g->size() + ranks * 1e9) << "f64 allreduce element " << i;
       }},
      {"reduce_scatter",
       [](TcpStore& store, const RankSetup& s) {
         auto g = join(store, s);
         check_reduce_scatter(*g, 37, 3);
         check_reduce_scatter(*g, 1, 0);
       }},
      {"all_gather",
       [](TcpStore& store, const RankSetup& s) {
         auto g = join(store, s);
         check_all_gather(*g, 5);
         check_all_gather_bytes(*g, 13);
       }},
      {"stream_all_gather",
       [](TcpStore& store, const RankSetup& s) {
         auto g = join(store, s);
         check_stream_all_gather(*g, 37);
         check_stream_all_gather(*g, (int64_t(1) << 20) + 3);  // beyond the emulator's 1 MiB chunks
         stream_collectives(g.get())->wait_enqueued();            // nothing enqueued: returns at once
       }},
      {"stream_reduce_scatter",
       [](TcpStore& store, const RankSetup& s) {
         auto g = join(store, s);
         check_stream_reduce_scatter(*g, 37);
         check_stream_reduce_scatter(*g, (int64_t(1) << 18) + 3);  // beyond the emulator's 1 MiB chunks
       }},
      {"broadcast",
       [](TcpStore& store, const RankSetup& s) {
         auto g = join(store, s);
         check_broadcast(*g, 8, 0);
         check_broadcast(*g, 1000, s.world - 1);
         g->barrier();
         g->barrier();
         check_allreduce(*g, 3);  // the barriers kept the ranks in step
       }},
      // Beyond the emulator's 1 MiB chunks, with counts that do not divide them.
      {"large",
       [](TcpStore& store, const RankSetup& s) {
         auto g = join(store, s);
         check_allreduce(*g, 2'500'003);
         check_reduce_scatter(*g, 700'001, 5);
         check_all_gather(*g, 300'007);
         check_all_gather_bytes(*g, (int64_t(3) << 20) + 1);
         check_broadcast(*g, 1'000'001, 1);
       }},
      // Rank 1 never starts (its parent launches rank 0 only).
      {"missing_peer",
       [](TcpStore& store, const RankSetup& s) {
         expect_group_error([&] { join(store, s); }, s, "ncclCommInitRank: timed out");
       }},
      // Rank 1 joins, then leaves without a collective: rank 0's allreduce waits for it in vain.
      {"peer_leaves",
       [](TcpStore& store, const RankSetup& s) {
         auto g = join(store, s);
         if (s.rank == 1) return;
         expect_group_error([&] { check_allreduce(*g, 10); }, s, "allreduce: timed out waiting for the peers");
       }},
      // Rank 1 joins, then leaves: rank 0's enqueued all-gather returns at once (nothing waits on the
      // host), and the poll before a host synchronisation ends it in the timeout Error naming it.
      {"peer_leaves_enqueued",
       [](TcpStore& store, const RankSetup& s) {
         DeviceArray<uint8_t> data(std::vector<uint8_t>(64, 1));
         expect_enqueued_collective_fails(store, s, "all_gather (prefetched): ",
                                          [&](StreamCollectives& c, cudaEvent_t ready, cudaEvent_t done) {
                                            c.enqueue_all_gather_bytes_in_place(data.data(), 32, ready, done);
                                          });
       }},
      // The same under an enqueued reduce-scatter, the last of two or three ranks leaving.
      {"peer_leaves_enqueued_reduce_scatter",
       [](TcpStore& store, const RankSetup& s) {
         DeviceArray<float> data(values(s.rank, 16 * int64_t(s.world)));
         expect_enqueued_collective_fails(store, s, "reduce_scatter (stream-ordered): ",
                                          [&](StreamCollectives& c, cudaEvent_t ready, cudaEvent_t done) {
                                            c.enqueue_reduce_scatter_sum_in_place(data.data(), 16, ready, done);
                                          });
       }},
      // Rank 1 (a 1 s timeout) gives up on an allreduce rank 0 has not started and aborts; then
      // rank 0 starts it: an Error, not a result (the emulator reports rank 1's abort as NCCL's
      // ncclRemoteError at once; real NCCL may only time out).
      {"peer_aborts",
       [](TcpStore& store, const RankSetup& s) {
         const std::string aborted = "ranks-" + s.name + "/rank 1 aborted";
         if (s.rank == 1) {
           auto g = make_nccl_process_group(store, "ranks-" + s.name, s.rank, s.world, std::chrono::seconds(1));
           expect_group_error([&] { check_allreduce(*g, 10); }, s, "allreduce: timed out waiting for the peers");
           store.set(aborted, "yes");
           return;
         }
         auto g = join(store, s);
         store.get(aborted);
#ifdef KTUNE_EMULATED_NCCL
         const char* said = "allreduce: remote process exited";
#else
         const char* said = "allreduce: ";
#endif
         expect_group_error([&] { check_allreduce(*g, 10); }, s, said);
       }},
#ifdef KTUNE_EMULATED_NCCL
      // The ranks call allreduces of different sizes: the emulator says so (an asynchronous
      // ncclInvalidUsage), and the group ends each rank's call in an Error, never a result. (Real
      // NCCL checks nothing here: it may hang, or return garbage, so this is the emulator's case.)
      {"mismatch",
       [](TcpStore& store, const RankSetup& s) {
         auto g = join(store, s);
         expect_group_error([&] { check_allreduce(*g, 10 + s.rank); }, s, "allreduce: a peer failed");
       }},
#endif
  };
  return cases;
}

// Where the ranks can run: the emulator gives each process a device of its own; a GPU machine
// needs a GPU per rank.
bool ranks_fit(int world) {
#ifdef KTUNE_EMULATED_NCCL
  return world > 0;
#else
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n >= world;
#endif
}

std::string exe_path() {
  std::vector<char> path(4096, 0);
  const ssize_t n = readlink("/proc/self/exe", path.data(), path.size() - 1);
  return n > 0 ? std::string(path.data(), size_t(n)) : std::string();
}

// Runs case `name` as ranks 0 .. launched - 1 of a world of `world`, each a process with its own
// environment (KTUNE_NCCL_TEST_* and `extra_env`); each must exit 0 within a minute. A failure
// shows the rank's output.
void run_ranks(const std::string& name, int world, int launched, std::chrono::milliseconds timeout,
               const std::vector<std::string>& extra_env = {}) {
  TcpStoreServer server(0);
  const std::string exe = exe_path();
  ASSERT_FALSE(exe.empty());
  std::vector<pid_t> pids;
  std::vector<std::string> logs;
  for (int r = 0; r < launched; ++r) {
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e)
      if (std::string(*e).rfind("KTUNE_NCCL_TEST_", 0) != 0) env.emplace_back(*e);
    env.push_back("KTUNE_NCCL_TEST_CASE=" + name);
    env.push_back("KTUNE_NCCL_TEST_RANK=" + std::to_string(r));
    env.push_back("KTUNE_NCCL_TEST_WORLD=" + std::to_string(world));
    env.push_back("KTUNE_NCCL_TEST_PORT=" + std::to_string(server.port()));
    env.push_back("KTUNE_NCCL_TEST_TIMEOUT_MS=" + std::to_string(timeout.count()));
    env.insert(env.end(), extra_env.begin(), extra_env.end());
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::string filter = "--gtest_filter=NcclProcessGroupRank.RunsTheCaseItsParentNames";
    std::vector<char*> argv = {const_cast<char*>(exe.c_str()), filter.data(), nullptr};
    char log_name[] = "/tmp/ktune-nccl-rank-XXXXXX";
    const int fd = mkstemp(log_name);
    ASSERT_GE(fd, 0);
    close(fd);
    logs.emplace_back(log_name);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log_name, O_WRONLY | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    pid_t pid = -1;
    const int spawned = posix_spawn(&pid, exe.c_str(), &actions, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    ASSERT_EQ(spawned, 0) << "cannot start rank " << r;
    pids.push_back(pid);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  std::vector<int> status(pids.size(), -1);
  std::vector<bool> exited(pids.size(), false);
  for (size_t left = pids.size(); left > 0;) {
    for (size_t r = 0; r < pids.size(); ++r)
      if (!exited[r] && waitpid(pids[r], &status[r], WNOHANG) == pids[r]) exited[r] = true, --left;
    if (left == 0) break;
    if (std::chrono::steady_clock::now() > deadline) {
      for (size_t r = 0; r < pids.size(); ++r)
        if (!exited[r]) kill(pids[r], SIGKILL), waitpid(pids[r], &status[r], 0);
      ADD_FAILURE() << name << ", world " << world << ": a rank hung for a minute (killed)";
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (size_t r = 0; r < pids.size(); ++r) {
    std::ifstream in(logs[r]);
    std::stringstream log;
    log << in.rdbuf();
    std::remove(logs[r].c_str());
    EXPECT_TRUE(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0)
        << name << ", world " << world << ": rank " << r << " failed; its output:\n"
        << log.str();
  }
}

// Every collective runs with W = 2 (the emulator's streams eager) and W = 3 (late: the group's
// stream holds its copies until waited for).
void run_worlds(const std::string& name) {
  if (!ranks_fit(3)) GTEST_SKIP() << "needs 3 GPUs, or the emulator";
  run_ranks(name, 2, 2, std::chrono::seconds(30));
  run_ranks(name, 3, 3, std::chrono::seconds(30), {"KTUNE_EMU_STREAMS=late"});
}

}  // namespace

// A rank of a multi-rank case (its parent, below, starts it with KTUNE_NCCL_TEST_*); skips when run
// on its own.
TEST(NcclProcessGroupRank, RunsTheCaseItsParentNames) {
  const char* name = std::getenv("KTUNE_NCCL_TEST_CASE");
  if (!name) GTEST_SKIP() << "a rank of NcclProcessGroupRanks' cases, started by them";
  RankSetup s;
  s.name = name;
  s.rank = std::atoi(std::getenv("KTUNE_NCCL_TEST_RANK"));
  s.world = std::atoi(std::getenv("KTUNE_NCCL_TEST_WORLD"));
  s.port = std::atoi(std::getenv("KTUNE_NCCL_TEST_PORT"));
  s.timeout = std::chrono::milliseconds(std::atoll(std::getenv("KTUNE_NCCL_TEST_TIMEOUT_MS")));
  auto it = rank_cases().find(s.name);
  ASSERT_NE(it, rank_cases().end()) << s.name;
#ifndef KTUNE_EMULATED_NCCL
  ASSERT_EQ(cudaSetDevice(s.rank), cudaSuccess);
#endif
  TcpStore store("127.0.0.1", s.port, 30s);
  it->second(store, s);
}

TEST(NcclProcessGroupRanks, AllreduceSumsF32AndF64) { run_worlds("allreduce"); }
TEST(NcclProcessGroupRanks, ReduceScatterApartInPlaceAndOverlapping) { run_worlds("reduce_scatter"); }
TEST(NcclProcessGroupRanks, AllGatherAndAllGatherBytesApartAndInPlace) { run_worlds("all_gather"); }
TEST(NcclProcessGroupRanks, BroadcastFromEitherEndAndBarriers) { run_worlds("broadcast"); }
TEST(NcclProcessGroupRanks, StreamOrderedAllGatherBehindAndBeforeEvents) { run_worlds("stream_all_gather"); }
TEST(NcclProcessGroupRanks, StreamOrderedReduceScatterBetweenBlockingCollectives) {
  run_worlds("stream_reduce_scatter");
}
TEST(NcclProcessGroupRanks, LargeCountsOfEveryCollective) { run_worlds("large"); }

TEST(NcclProcessGroupRanks, APeerThatNeverJoinsEndsInTheTimeoutError) {
  if (!ranks_fit(2)) GTEST_SKIP() << "needs 2 GPUs, or the emulator";
  run_ranks("missing_peer", 2, 1, std::chrono::milliseconds(1500));
}

TEST(NcclProcessGroupRanks, APeerThatLeavesEndsTheNextCollectiveInTheTimeoutError) {
  if (!ranks_fit(2)) GTEST_SKIP() << "needs 2 GPUs, or the emulator";
  run_ranks("peer_leaves", 2, 2, std::chrono::milliseconds(1500));
}

TEST(NcclProcessGroupRanks, APeerThatLeavesEndsAnEnqueuedAllGatherInThePollsTimeoutError) {
  if (!ranks_fit(2)) GTEST_SKIP() << "needs 2 GPUs, or the emulator";
  run_ranks("peer_leaves_enqueued", 2, 2, std::chrono::milliseconds(1500));
}

TEST(NcclProcessGroupRanks, APeerThatLeavesEndsAnEnqueuedReduceScatterInThePollsError) {
  if (!ranks_fit(3)) GTEST_SKIP() << "needs 3 GPUs, or the emulator";
  run_ranks("peer_leaves_enqueued_reduce_scatter", 2, 2, std::chrono::milliseconds(1500));
  run_ranks("peer_leaves_enqueued_reduce_scatter", 3, 3, std::chrono::milliseconds(1500), {"KTUNE_EMU_STREAMS=late"});
}

TEST(NcclProcessGroupRanks, APeerThatAbortsEndsItsPeersCollectiveInAnError) {
  if (!ranks_fit(2)) GTEST_SKIP() << "needs 2 GPUs, or the emulator";
  run_ranks("peer_aborts", 2, 2, std::chrono::seconds(30));
}

#ifdef KTUNE_EMULATED_NCCL
TEST(NcclProcessGroupRanks, RanksCallingDifferentCollectivesEndInAnError) {
  run_ranks("mismatch", 2, 2, std::chrono::seconds(30));
}
#endif
#endif
