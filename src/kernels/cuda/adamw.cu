// AdamW kernels: a thread per element; scalars computed on the host in double exactly as the CPU
// op computes them (kernels/cpu/adamw.cpp), then narrowed to f32.
#include "kernels/cuda/adamw.h"

#include <cmath>
#include <string>

#include "core/error.h"
#include "core/random_bits.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"

namespace ktune::cuda {
namespace {

// core/dtype.h's f32_to_bf16_stochastic: add 16 random bits below the kept half, truncate.
__device__ __forceinline__ uint16_t bf16_stochastic(float f, uint32_t random16) {
  uint32_t bits = __float_as_uint(f);
  if ((bits & 0x7f800000u) == 0x7f800000u) {  // inf, NaN: round to nearest even (NaN stays NaN)
    if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x0040u);
    return uint16_t(bits >> 16);
  }
  return uint16_t((bits + (random16 & 0xffffu)) >> 16);
}

__device__ __forceinline__ float bf16_bits_to_f32(uint16_t h) { return __uint_as_float(uint32_t(h) << 16); }

__global__ void adamw_kernel(float* param, const float* grad, float* m, float* v, int64_t n, AdamWCoefficients c) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float g = grad[i];
  float p = param[i] * c.decay;
  float mi = m[i] + (g - m[i]) * c.one_minus_b1;
  float vi = v[i] * c.b2 + c.one_minus_b2 * g * g;
  float denom = sqrtf(vi) * c.inv_bc2_sqrt + c.eps;
  param[i] = p - c.step_size * mi / denom;
  m[i] = mi;
  v[i] = vi;
}

__global__ void adamw_bf16_kernel(uint16_t* param, const float* grad, uint16_t* m, uint16_t* v, int64_t n,
                                  AdamWCoefficients c, uint64_t key, int64_t first) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float g = grad[i];
  float mf = bf16_bits_to_f32(m[i]), vf = bf16_bits_to_f32(v[i]);
  float p = bf16_bits_to_f32(param[i]) * c.decay;
  mf = mf + (g - mf) * c.one_minus_b1;
  vf = vf * c.b2 + c.one_minus_b2 * g * g;
  p -= c.step_size * mf / (sqrtf(vf) * c.inv_bc2_sqrt + c.eps);
  uint64_t bits = splitmix64(key ^ uint64_t(first + i));  // 48 bits used: 16 for each tensor (as the CPU op)
  param[i] = bf16_stochastic(p, uint32_t(bits));
  m[i] = bf16_stochastic(mf, uint32_t(bits >> 16));
  v[i] = bf16_stochastic(vf, uint32_t(bits >> 32));
}

constexpr int kSumBlocks = 1024, kSumThreads = 256;

// Block b sums x[i]^2 for i = b*256 + t + k*(1024*256), each thread in double, then a tree: partial[b].
__global__ void sum_of_squares_partial_kernel(double* partial, const float* x, int64_t n) {
  __shared__ double s[kSumThreads];
  double acc = 0;
  for (int64_t i = int64_t(blockIdx.x) * kSumThreads + threadIdx.x; i < n; i += int64_t(kSumBlocks) * kSumThreads) {
    const double v = x[i];
    acc += v * v;
  }
  s[threadIdx.x] = acc;
  __syncthreads();
  for (int stride = kSumThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) s[threadIdx.x] += s[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = s[0];
}

// One block of 1024 threads: total = tree sum of the 1024 partials.
__global__ void sum_partials_kernel(double* total, const double* partial) {
  __shared__ double s[kSumBlocks];
  s[threadIdx.x] = partial[threadIdx.x];
  __syncthreads();
  for (int stride = kSumBlocks / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) s[threadIdx.x] += s[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) *total = s[0];
}

__global__ void scale_kernel(float* x, int64_t n, float factor) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= factor;
}

__global__ void accumulate_kernel(float* y, const float* x, int64_t n) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] += x[i];
}

}  // namespace

int64_t sum_of_squares_scratch_doubles() { return 1 + kSumBlocks; }

void sum_of_squares(double* scratch, const float* x, int64_t n, Stream stream) {
  sum_of_squares_partial_kernel<<<kSumBlocks, kSumThreads, 0, stream>>>(scratch + 1, x, n);
  KTUNE_CUDA_CHECK_LAUNCH();
  sum_partials_kernel<<<1, kSumBlocks, 0, stream>>>(scratch, scratch + 1);
  KTUNE_CUDA_CHECK_LAUNCH();
}

void scale_inplace(float* x, int64_t n, float factor, Stream stream) {
  if (n == 0) return;
  scale_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(x, n, factor);
  KTUNE_CUDA_CHECK_LAUNCH();
}

void accumulate_inplace(float* y, const float* x, int64_t n, Stream stream) {
  if (n == 0) return;
  accumulate_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(y, x, n);
  KTUNE_CUDA_CHECK_LAUNCH();
}

void adamw_step(float* param, const float* grad, float* m, float* v, int64_t n, const AdamWStep& s, Stream stream) {
  const AdamWCoefficients c = adamw_coefficients(s);
  if (n == 0) return;
  adamw_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(param, grad, m, v, n, c);
  KTUNE_CUDA_CHECK_LAUNCH();
}

void adamw_step_bf16(bf16_t* param, const float* grad, bf16_t* m, bf16_t* v, int64_t n, const AdamWStep& s,
                     uint64_t seed, Stream stream, int64_t first) {
  const AdamWCoefficients c = adamw_coefficients(s);
  if (n == 0) return;
  adamw_bf16_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(param, grad, m, v, n, c, splitmix64(seed), first);
  KTUNE_CUDA_CHECK_LAUNCH();
}

}  // namespace ktune::cuda
