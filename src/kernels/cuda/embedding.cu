// Embedding kernels: a thread per element, ids checked on the device.
#include "kernels/cuda/embedding.h"

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"

namespace ktune::cuda {
namespace {

template <typename T>
__global__ void embedding_forward_kernel(T* out, const int32_t* ids, const T* table, int64_t N, int64_t C, int64_t V,
                                         float scale, int32_t* flag) {
  int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= N * C) return;
  int64_t r = idx / C, c = idx % C;
  int32_t id = ids[r];
  if (id < 0 || id >= V) {
    store_f32(out, idx, 0.0f);
    if (c == 0) flag_bad_row(flag, r);
    return;
  }
  store_f32(out, idx, load_f32(table, int64_t(id) * C + c) * scale);
}

template <typename T>
__global__ void embedding_backward_kernel(float* dtable, const T* dout, const int32_t* ids, int64_t N, int64_t C,
                                          int64_t V, float scale, int32_t* flag) {
  int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= N * C) return;
  int64_t r = idx / C, c = idx % C;
  int32_t id = ids[r];
  if (id < 0 || id >= V) {
    if (c == 0) flag_bad_row(flag, r);
    return;
  }
  atomicAdd(dtable + int64_t(id) * C + c, load_f32(dout, idx) * scale);
}

template <typename T>
void forward(T* out, const int32_t* ids, const T* table, int64_t N, int64_t C, int64_t V, float scale, int32_t* flag,
             Stream stream) {
  if (N * C == 0) return;
  embedding_forward_kernel<<<blocks_for(N * C, 256), 256, 0, stream>>>(out, ids, table, N, C, V, scale, flag);
  KTUNE_CUDA_CHECK_LAUNCH();
}

template <typename T>
void backward(float* dtable, const T* dout, const int32_t* ids, int64_t N, int64_t C, int64_t V, float scale,
              int32_t* flag, Stream stream) {
  if (N * C == 0) return;
  embedding_backward_kernel<<<blocks_for(N * C, 256), 256, 0, stream>>>(dtable, dout, ids, N, C, V, scale, flag);
  KTUNE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void embedding_forward(float* out, const int32_t* ids, const float* table, int64_t N, int64_t C, int64_t V, float scale,
                       int32_t* flag, Stream stream) {
  forward(out, ids, table, N, C, V, scale, flag, stream);
}
void embedding_forward(bf16_t* out, const int32_t* ids, const bf16_t* table, int64_t N, int64_t C, int64_t V,
                       float scale, int32_t* flag, Stream stream) {
  forward(dev(out), ids, dev(table), N, C, V, scale, flag, stream);
}
void embedding_backward(float* dtable, const float* dout, const int32_t* ids, int64_t N, int64_t C, int64_t V,
                        float scale, int32_t* flag, Stream stream) {
  backward(dtable, dout, ids, N, C, V, scale, flag, stream);
}
void embedding_backward(float* dtable, const bf16_t* dout, const int32_t* ids, int64_t N, int64_t C, int64_t V,
                        float scale, int32_t* flag, Stream stream) {
  backward(dtable, dev(dout), ids, N, C, V, scale, flag, stream);
}

}  // namespace ktune::cuda
