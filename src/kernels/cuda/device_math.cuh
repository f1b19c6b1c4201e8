// Device-side helpers shared by the CUDA kernels (included by .cu files only): loads and stores
// that widen bf16 to f32 and round back (nearest even), and warp/block sums.
// It deliberately holds no kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "core/dtype.h"

namespace ktune::cuda {

__device__ __forceinline__ float load_f32(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load_f32(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void store_f32(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void store_f32(__nv_bfloat16* p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }

// A score soft-capped as Gemma2 caps its attention scores and final logits: softcap tanh(s / softcap)
// when softcap > 0, else s; *t = the tanh (0 without a cap), for the backward's derivative 1 - t^2.
__device__ __forceinline__ float softcap_score(float s, float softcap, float* t) {
  if (softcap > 0.0f) {
    *t = tanhf(s / softcap);
    return softcap * *t;
  }
  *t = 0.0f;
  return s;
}
__device__ __forceinline__ float softcap_score(float s, float softcap) {
  float t;
  return softcap_score(s, softcap, &t);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
// `shared` holds 32 floats. Callers must not reuse `shared` before a __syncthreads().
__device__ __forceinline__ float block_sum(float v, float* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float total = lane < warps ? shared[lane] : 0.0f;
  return warp_sum(total);
}

__device__ __forceinline__ float block_max(float v, float* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float m = lane < warps ? shared[lane] : -INFINITY;
  return warp_max(m);
}

// Record row r as bad (the smallest bad row wins).
__device__ __forceinline__ void flag_bad_row(int32_t* flag, int64_t r) {
  if (flag) atomicMin(flag, int32_t(r));
}

inline unsigned blocks_for(int64_t n, int threads) { return unsigned((n + threads - 1) / threads); }

template <typename T>
struct DeviceType { using type = T; };
template <>
struct DeviceType<bf16_t> { using type = __nv_bfloat16; };
// The device element type of a host pointer type: float -> float, bf16_t -> __nv_bfloat16.
template <typename T>
auto* dev(T* p) { return reinterpret_cast<typename DeviceType<std::remove_const_t<T>>::type*>(p); }
template <typename T>
auto* dev(const T* p) { return reinterpret_cast<const typename DeviceType<T>::type*>(p); }

}  // namespace ktune::cuda
