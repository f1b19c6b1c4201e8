// NF4 dequantisation: a thread per byte (two values), the 16 codes in constant memory.
#include "kernels/cuda/nf4.h"

#include <string>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"

namespace ktune::cuda {
namespace {

// kernels/cpu/nf4.cpp's kNf4Codes (bitsandbytes' NF4 table).
__constant__ float kCodes[16] = {-1.0f,
                                 -0.6961928009986877f,
                                 -0.5250730514526367f,
                                 -0.39491748809814453f,
                                 -0.28444138169288635f,
                                 -0.18477343022823334f,
                                 -0.09105003625154495f,
                                 0.0f,
                                 0.07958029955625534f,
                                 0.16093020141124725f,
                                 0.24611230194568634f,
                                 0.33791524171829224f,
                                 0.44070982933044434f,
                                 0.5626170039176941f,
                                 0.7229568362236023f,
                                 1.0f};

template <typename T>
__global__ void nf4_dequantize_kernel(T* x, const uint8_t* codes, const float* scales, int64_t bytes) {
  int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= bytes) return;
  const uint8_t byte = codes[b];
  const float scale = scales[(2 * b) / 64];
  store_f32(x, 2 * b, kCodes[byte >> 4] * scale);
  store_f32(x, 2 * b + 1, kCodes[byte & 0x0f] * scale);
}

template <typename T>
void dequantize(T* x, const uint8_t* codes, const float* scales, int64_t n, Stream stream) {
  check(n % 64 == 0, "cuda nf4", "tensor of " + std::to_string(n) + " elements is not a whole number of 64-blocks");
  if (n == 0) return;
  nf4_dequantize_kernel<<<blocks_for(n / 2, 256), 256, 0, stream>>>(x, codes, scales, n / 2);
  KTUNE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void nf4_dequantize(float* x, const uint8_t* codes, const float* scales, int64_t n, Stream stream) {
  dequantize(x, codes, scales, n, stream);
}
void nf4_dequantize(bf16_t* x, const uint8_t* codes, const float* scales, int64_t n, Stream stream) {
  dequantize(dev(x), codes, scales, n, stream);
}

void nf4_linear_forward(GemmContext& ctx, float* y, const bf16_t* x, const uint8_t* codes, const float* scales,
                        int64_t N, int64_t in, int64_t out, bf16_t* scratch, Stream stream) {
  nf4_dequantize(scratch, codes, scales, out * in, stream);
  gemm_bf16(ctx, false, true, N, out, in, 1.0f, x, scratch, 0.0f, y, stream);
}

void nf4_linear_backward_input(GemmContext& ctx, float* dx, const bf16_t* dy, const uint8_t* codes, const float* scales,
                               int64_t N, int64_t in, int64_t out, bf16_t* scratch, bool accumulate_dx, Stream stream) {
  nf4_dequantize(scratch, codes, scales, out * in, stream);
  gemm_bf16(ctx, false, false, N, in, out, 1.0f, dy, scratch, accumulate_dx ? 1.0f : 0.0f, dx, stream);
}

}  // namespace ktune::cuda
