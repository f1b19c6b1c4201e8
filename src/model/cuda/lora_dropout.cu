// LoRA dropout masks on the device (see lora_dropout.h): the CPU LoraAdapter's splitmix64 / FNV-1a
// functions, written out again in device code.
#include "model/cuda/lora_dropout.h"

#include <cuda_bf16.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"

namespace ktune::cuda {

namespace {

__host__ __device__ __forceinline__ uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// LoraAdapter::dropped: uniform01(seed, i) < p, 24 bits of resolution.
__device__ __forceinline__ bool dropped(uint64_t seed, uint64_t i, float p) {
  const float u = float(splitmix64(seed ^ splitmix64(i)) >> 40) * (1.0f / 16777216.0f);
  return u < p;
}

// FNV-1a (64-bit) of the module name, as the CPU adapter's fnv1a64.
uint64_t fnv1a64(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

__global__ void mask_kernel(uint8_t* keep, int64_t n, uint64_t seed, float p) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) keep[i] = dropped(seed, uint64_t(i), p) ? 0 : 1;
}

__global__ void forward_kernel(__nv_bfloat16* xd, const __nv_bfloat16* x, int64_t n, uint64_t seed, float p,
                               float keep_scale) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  xd[i] = dropped(seed, uint64_t(i), p) ? __float2bfloat16_rn(0.0f)
                                        : __float2bfloat16_rn(__bfloat162float(x[i]) * keep_scale);
}

__global__ void backward_add_kernel(__nv_bfloat16* dx, const __nv_bfloat16* d, int64_t n, uint64_t seed, float p,
                                    float keep_scale) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n || dropped(seed, uint64_t(i), p)) return;
  dx[i] = __float2bfloat16_rn(__bfloat162float(dx[i]) + __bfloat162float(d[i]) * keep_scale);
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

void lora_dropout_forward(bf16_t* xd, const bf16_t* x, int64_t n, uint64_t seed, float p, Stream stream) {
  if (n == 0) return;
  forward_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(dev(xd), dev(x), n, seed, p, 1.0f / (1.0f - p));
  KTUNE_CUDA_CHECK_LAUNCH();
}

void lora_dropout_backward_add(bf16_t* dx, const bf16_t* d, int64_t n, uint64_t seed, float p, Stream stream) {
  if (n == 0) return;
  backward_add_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(dev(dx), dev(d), n, seed, p, 1.0f / (1.0f - p));
  KTUNE_CUDA_CHECK_LAUNCH();
}

}  // namespace ktune::cuda
