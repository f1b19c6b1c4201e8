// DoRA's row and column kernels (see dora.h).
#include "model/cuda/dora.h"

#include <cuda_bf16.h>

#include <string>

#include "core/error.h"

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"

namespace ktune::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kRowsPerChunk = 256;  // dora_magnitude_grad: rows one thread sums before its atomic add

__global__ void widen_kernel(float* w, const __nv_bfloat16* x, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) w[i] = __bfloat162float(x[i]);
}

// One block per row.
__global__ void weight_norm_kernel(float* norm, float* scale, const float* w, const __nv_bfloat16* magnitude,
                                   int64_t in) {
  __shared__ float shared[32];
  const int64_t o = blockIdx.x;
  const float* row = w + o * in;
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < in; i += blockDim.x) sum += row[i] * row[i];
  sum = block_sum(sum, shared);
  if (threadIdx.x == 0) {
    const float n = sqrtf(sum);
    norm[o] = n;
    scale[o] = __bfloat162float(magnitude[o]) / n;
  }
}

__global__ void combine_kernel(__nv_bfloat16* y, const __nv_bfloat16* pre, const __nv_bfloat16* minus,
                               const float* scale, const __nv_bfloat16* bias, float beta, int64_t N, int64_t out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N * out) return;
  const int64_t o = i % out;
  float v = scale[o] * __bfloat162float(pre[i]);
  if (minus) v -= __bfloat162float(minus[i]);
  if (bias) v += __bfloat162float(bias[o]);
  if (beta != 0.0f) v += beta * __bfloat162float(y[i]);
  y[i] = __float2bfloat16_rn(v);
}

__global__ void scale_columns_kernel(__nv_bfloat16* d, const __nv_bfloat16* dy, const float* scale, float offset,
                                     int64_t N, int64_t out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N * out) return;
  d[i] = __float2bfloat16_rn(__bfloat162float(dy[i]) * (scale[i % out] + offset));
}

// grid (columns / kThreads, row chunks): each thread sums one column over one chunk of rows.
__global__ void magnitude_grad_kernel(float* dm, const __nv_bfloat16* dy, const __nv_bfloat16* pre,
                                      const float* norm, int64_t N, int64_t out) {
  const int64_t o = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (o >= out) return;
  const int64_t n0 = int64_t(blockIdx.y) * kRowsPerChunk, n1 = min(N, n0 + kRowsPerChunk);
  float sum = 0.0f;
  for (int64_t n = n0; n < n1; ++n) sum += __bfloat162float(dy[n * out + o]) * __bfloat162float(pre[n * out + o]);
  atomicAdd(dm + o, sum / norm[o]);
}

}  // namespace

void dora_widen(float* w, const bf16_t* x, int64_t n, Stream stream) {
  if (n == 0) return;
  widen_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(w, dev(x), n);
  KTUNE_CUDA_CHECK_LAUNCH();
}

void dora_weight_norm(float* norm, float* scale, const float* w, const bf16_t* magnitude, int64_t out, int64_t in,
                      Stream stream) {
  if (out == 0) return;
  weight_norm_kernel<<<unsigned(out), kThreads, 0, stream>>>(norm, scale, w, dev(magnitude), in);
  KTUNE_CUDA_CHECK_LAUNCH();
}

void dora_combine(bf16_t* y, const bf16_t* pre, const bf16_t* minus, const float* scale, const bf16_t* bias,
                  float beta, int64_t N, int64_t out, Stream stream) {
  if (N * out == 0) return;
  combine_kernel<<<blocks_for(N * out, kThreads), kThreads, 0, stream>>>(dev(y), dev(pre), dev(minus), scale,
                                                                          dev(bias), beta, N, out);
  KTUNE_CUDA_CHECK_LAUNCH();
}

void dora_scale_columns(bf16_t* d, const bf16_t* dy, const float* scale, float offset, int64_t N, int64_t out,
                        Stream stream) {
  if (N * out == 0) return;
  scale_columns_kernel<<<blocks_for(N * out, kThreads), kThreads, 0, stream>>>(dev(d), dev(dy), scale, offset, N,
                                                                                out);
  KTUNE_CUDA_CHECK_LAUNCH();
}

void dora_magnitude_grad(float* dm, const bf16_t* dy, const bf16_t* pre, const float* norm, int64_t N, int64_t out,
                         Stream stream) {
  if (N * out == 0) return;
  const int64_t chunks = (N + kRowsPerChunk - 1) / kRowsPerChunk;
  check(chunks <= 65535, "cuda dora", "magnitude gradient over " + std::to_string(N) + " rows: at most 65535 chunks of 256");
  const dim3 grid(blocks_for(out, kThreads), unsigned(chunks));
  magnitude_grad_kernel<<<grid, kThreads, 0, stream>>>(dm, dev(dy), dev(pre), norm, N, out);
  KTUNE_CUDA_CHECK_LAUNCH();
}

}  // namespace ktune::cuda
