// NF4 dequantisation: a thread per byte (two values), the 16 codes in constant memory: torchao's values
// rounded to bf16, the table a bf16 weight's NF4 is made with (the scales, made by the CPU quantiser in
// bf16 arithmetic, are bf16 values, held so), so code * scale is exact in f32 and its bf16 rounding torchao's.
#include "kernels/cuda/nf4.h"

#include <string>

#include "core/error.h"
#include "kernels/cpu/nf4.h"  // KTUNE_NF4_CODE_VALUES_BF16 (a plain header)
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"

namespace ktune::cuda {
namespace {

// The CPU's kNf4CodesBf16, from the same initialiser.
__constant__ float kCodes[16] = KTUNE_NF4_CODE_VALUES_BF16;

template <typename T>
__global__ void nf4_dequantize_kernel(T* x, const uint8_t* codes, const __nv_bfloat16* scales, int64_t bytes) {
  int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= bytes) return;
  const uint8_t byte = codes[b];
  const float scale = load_f32(scales, (2 * b) / 64);
  store_f32(x, 2 * b, kCodes[byte >> 4] * scale);
  store_f32(x, 2 * b + 1, kCodes[byte & 0x0f] * scale);
}

template <typename T>
void dequantize(T* x, const uint8_t* codes, const bf16_t* scales, int64_t n, Stream stream) {
  check(n % 64 == 0, "cuda nf4", "tensor of " + std::to_string(n) + " elements is not a whole number of 64-blocks");
  if (n == 0) return;
  nf4_dequantize_kernel<<<blocks_for(n / 2, 256), 256, 0, stream>>>(x, codes, dev(scales), n / 2);
  KTUNE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void nf4_dequantize(float* x, const uint8_t* codes, const bf16_t* scales, int64_t n, Stream stream) {
  dequantize(x, codes, scales, n, stream);
}
void nf4_dequantize(bf16_t* x, const uint8_t* codes, const bf16_t* scales, int64_t n, Stream stream) {
  dequantize(dev(x), codes, scales, n, stream);
}

void nf4_linear_forward(GemmContext& ctx, float* y, const bf16_t* x, const uint8_t* codes, const bf16_t* scales,
                        int64_t N, int64_t in, int64_t out, bf16_t* scratch, Stream stream) {
  nf4_dequantize(scratch, codes, scales, out * in, stream);
  gemm_bf16(ctx, false, true, N, out, in, 1.0f, x, scratch, 0.0f, y, stream);
}

void nf4_linear_backward_input(GemmContext& ctx, float* dx, const bf16_t* dy, const uint8_t* codes, const bf16_t* scales,
                               int64_t N, int64_t in, int64_t out, bf16_t* scratch, bool accumulate_dx, Stream stream) {
  nf4_dequantize(scratch, codes, scales, out * in, stream);
  gemm_bf16(ctx, false, false, N, in, out, 1.0f, dy, scratch, accumulate_dx ? 1.0f : 0.0f, dx, stream);
}

}  // namespace ktune::cuda
