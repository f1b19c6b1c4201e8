// The ProcessGroup interface over NCCL, for the CUDA backend: buffers are device pointers on the GPU
// this process selected (cudaSetDevice) before the call. Part of the dist layer's CUDA side: not in
// ktune_dist (so neither the ktune binary nor any CPU run links NCCL or the CUDA runtime); the GPU
// step plugin (src/train/cuda), the NCCL tests and the host emulator compile process_group_nccl.cpp
// themselves, over the `ktune_nccl` target (src/dist/CMakeLists.txt) or the emulator's fake NCCL.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "dist/process_group.h"
#include "dist/tcp_store.h"

namespace ktune::dist {

// Joins the group `prefix` of `size` ranks through the store; every rank calls it with the same
// prefix. Throws an Error naming the build when it was compiled without NCCL (KTUNE_HAS_NCCL unset);
// nccl_available() says which.
std::unique_ptr<ProcessGroup> make_nccl_process_group(TcpStore& store, const std::string& prefix, int rank, int size,
                                                      std::chrono::milliseconds timeout = std::chrono::seconds(300));
bool nccl_available();

}  // namespace ktune::dist
