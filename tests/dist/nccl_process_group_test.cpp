// The NCCL process group: without NCCL in the build it says so; with NCCL but no GPU it fails with
// an Error (not a crash); with a GPU, a world of one gives each collective's identity on device
// buffers. Multi-rank NCCL needs one GPU per rank and is not tested here.
#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"
#include "dist/process_group.h"
#include "dist/tcp_store.h"

#ifdef KTUNE_HAS_NCCL
#include <cuda_runtime.h>
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
#endif
