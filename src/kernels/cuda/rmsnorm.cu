// RMSNorm kernels. Forward and dx: a block of 256 threads per row (block sums in f32).
// dw: blocks of 32 columns x 16 warps; warp w sums rows w, w+16, ... of its columns, then the 16
// partial sums are added in warp order: the same result on every run.
//   y = x r w',  r = (mean(x^2) + eps)^-1/2,  w' = offset + w
//   dx = r (dy w') - x r^3 / C * sum(dy w' x),   dw += sum_rows(dy x r)
#include "kernels/cuda/rmsnorm.h"

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"

namespace ktune::cuda {
namespace {

constexpr int kRowThreads = 256;

template <typename T>
__global__ void rmsnorm_forward_kernel(T* y, float* rstd, const T* x, const T* w, int64_t C, float eps, float offset) {
  __shared__ float shared[32];
  const int64_t r = blockIdx.x;
  const T* xr = x + r * C;
  float ss = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float v = load_f32(xr, c);
    ss += v * v;
  }
  ss = block_sum(ss, shared);
  const float rs = rsqrtf(ss / float(C) + eps);
  if (threadIdx.x == 0) rstd[r] = rs;
  T* yr = y + r * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) store_f32(yr, c, load_f32(xr, c) * rs * (offset + load_f32(w, c)));
}

template <typename T>
__global__ void rmsnorm_dx_kernel(T* dx, const T* dy, const T* x, const T* w, const float* rstd, int64_t C,
                                  float offset) {
  __shared__ float shared[32];
  const int64_t r = blockIdx.x;
  const T *xr = x + r * C, *dyr = dy + r * C;
  float dot = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dot += load_f32(dyr, c) * (offset + load_f32(w, c)) * load_f32(xr, c);
  dot = block_sum(dot, shared);
  const float rs = rstd[r];
  const float k = dot * rs * rs * rs / float(C);
  T* dxr = dx + r * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
    store_f32(dxr, c, rs * load_f32(dyr, c) * (offset + load_f32(w, c)) - load_f32(xr, c) * k);
}

constexpr int kDwWarps = 16;

template <typename T>
__global__ void rmsnorm_dw_kernel(float* dw, const T* dy, const T* x, const float* rstd, int64_t N, int64_t C) {
  __shared__ float partial[kDwWarps][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t c = int64_t(blockIdx.x) * 32 + lane;
  float acc = 0.0f;
  if (c < C)
    for (int64_t r = warp; r < N; r += kDwWarps) acc += load_f32(dy, r * C + c) * load_f32(x, r * C + c) * rstd[r];
  partial[warp][lane] = acc;
  __syncthreads();
  if (warp == 0 && c < C) {
    float total = 0.0f;
    for (int i = 0; i < kDwWarps; ++i) total += partial[i][lane];
    dw[c] += total;
  }
}

template <typename T>
void forward(T* y, float* rstd, const T* x, const T* w, int64_t N, int64_t C, float eps, float offset, Stream stream) {
  if (N == 0) return;
  rmsnorm_forward_kernel<<<unsigned(N), kRowThreads, 0, stream>>>(y, rstd, x, w, C, eps, offset);
  KTUNE_CUDA_CHECK_LAUNCH();
}

template <typename T>
void backward(T* dx, float* dw, const T* dy, const T* x, const T* w, const float* rstd, int64_t N, int64_t C,
              float offset, Stream stream) {
  if (N == 0) return;
  rmsnorm_dx_kernel<<<unsigned(N), kRowThreads, 0, stream>>>(dx, dy, x, w, rstd, C, offset);
  KTUNE_CUDA_CHECK_LAUNCH();
  if (dw) {
    rmsnorm_dw_kernel<<<blocks_for(C, 32), 32 * kDwWarps, 0, stream>>>(dw, dy, x, rstd, N, C);
    KTUNE_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

void rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, int64_t N, int64_t C, float eps,
                     float weight_offset, Stream stream) {
  forward(y, rstd, x, w, N, C, eps, weight_offset, stream);
}
void rmsnorm_forward(bf16_t* y, float* rstd, const bf16_t* x, const bf16_t* w, int64_t N, int64_t C, float eps,
                     float weight_offset, Stream stream) {
  forward(dev(y), rstd, dev(x), dev(w), N, C, eps, weight_offset, stream);
}
void rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x, const float* w, const float* rstd,
                      int64_t N, int64_t C, float weight_offset, Stream stream) {
  backward(dx, dw, dy, x, w, rstd, N, C, weight_offset, stream);
}
void rmsnorm_backward(bf16_t* dx, float* dw, const bf16_t* dy, const bf16_t* x, const bf16_t* w, const float* rstd,
                      int64_t N, int64_t C, float weight_offset, Stream stream) {
  backward(dev(dx), dw, dev(dy), dev(x), dev(w), rstd, N, C, weight_offset, stream);
}

}  // namespace ktune::cuda
