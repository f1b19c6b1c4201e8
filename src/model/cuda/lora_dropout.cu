// LoRA dropout masks on the device (see lora_dropout.h): the CPU LoraAdapter's functions, from the
// one host/device definition in core/random_bits.h.
#include "model/cuda/lora_dropout.h"

#include <cuda_bf16.h>

#include "core/random_bits.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"

namespace ktune::cuda {

namespace {

// LoraAdapter::dropped: uniform01(seed, i) < p.
__device__ __forceinline__ bool dropped(uint64_t seed, uint64_t i, float p) { return uniform01(seed, i) < p; }

__global__ void mask_kernel(uint8_t* keep, int64_t n, uint64_t seed, float p) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) keep[i] = dropped(seed, uint64_t(i), p) ? 0 : 1;
}

__global__ void forward_kernel(__nv_bfloat16* xd, const __nv_bfloat16* x, int64_t n, uint64_t seed, float p,
                               float keep_scale, int64_t first) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  xd[i] = dropped(seed, uint64_t(first + i), p) ? __float2bfloat16_rn(0.0f)
                                        : __float2bfloat16_rn(__bfloat162float(x[i]) * keep_scale);
}

__global__ void backward_add_kernel(__nv_bfloat16* dx, const __nv_bfloat16* d, int64_t n, uint64_t seed, float p,
                                    float keep_scale, int64_t first) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n || dropped(seed, uint64_t(first + i), p)) return;
  dx[i] = __float2bfloat16_rn(__bfloat162float(dx[i]) + __bfloat162float(d[i]) * keep_scale);
}

// d bf16 or f32
template <typename D>
__global__ void backward_add_f32_kernel(float* dx, const D* d, int64_t n, uint64_t seed, float p, float keep_scale,
                                        int64_t first) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n || dropped(seed, uint64_t(first + i), p)) return;
  dx[i] += load_f32(d, i) * keep_scale;
}

}  // namespace

uint64_t lora_dropout_seed(uint64_t lora_seed, uint64_t key, const std::string& module) {
  return splitmix64(lora_seed ^ splitmix64(key) ^ fnv1a64(module));
}

void lora_dropout_mask(uint8_t* keep, int64_t n, uint64_t seed, float p, Stream stream) {
  if (n == 0) return;
  mask_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(keep, n, seed, p);
  KTUNE_CUDA_CHECK_LAUNCH();
}

void lora_dropout_forward(bf16_t* xd, const bf16_t* x, int64_t n, uint64_t seed, float p, int64_t first,
                          Stream stream) {
  if (n == 0) return;
  forward_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(dev(xd), dev(x), n, seed, p, 1.0f / (1.0f - p), first);
  KTUNE_CUDA_CHECK_LAUNCH();
}

void lora_dropout_backward_add(bf16_t* dx, const bf16_t* d, int64_t n, uint64_t seed, float p, int64_t first,
                               Stream stream) {
  if (n == 0) return;
  backward_add_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(dev(dx), dev(d), n, seed, p, 1.0f / (1.0f - p),
                                                              first);
  KTUNE_CUDA_CHECK_LAUNCH();
}

void lora_dropout_backward_add(float* dx, const bf16_t* d, int64_t n, uint64_t seed, float p, int64_t first,
                               Stream stream) {
  if (n == 0) return;
  backward_add_f32_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(dx, dev(d), n, seed, p, 1.0f / (1.0f - p), first);
  KTUNE_CUDA_CHECK_LAUNCH();
}

void lora_dropout_backward_add(float* dx, const float* d, int64_t n, uint64_t seed, float p, int64_t first,
                               Stream stream) {
  if (n == 0) return;
  backward_add_f32_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(dx, d, n, seed, p, 1.0f / (1.0f - p), first);
  KTUNE_CUDA_CHECK_LAUNCH();
}

}  // namespace ktune::cuda
