// RoPE: a thread per rotated pair (n, h, i < D/2).
#include "kernels/cuda/rope.h"

#include <string>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"

namespace ktune::cuda {
namespace {

template <typename T>
__global__ void rope_kernel(T* x, const int32_t* positions, const float* cos_table, const float* sin_table,
                            int64_t max_positions, int64_t N, int64_t H, int64_t D, float sign, int32_t* flag) {
  const int64_t half = D / 2;
  int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= N * H * half) return;
  const int64_t i = idx % half, nh = idx / half, n = nh / H;
  const int32_t pos = positions[n];
  if (pos < 0 || pos >= max_positions) {
    if (idx % (H * half) == 0) flag_bad_row(flag, n);
    return;
  }
  const float c = cos_table[int64_t(pos) * half + i], s = sign * sin_table[int64_t(pos) * half + i];
  T* lo = x + nh * D;
  const float a = load_f32(lo, i), b = load_f32(lo, i + half);
  store_f32(lo, i, a * c - b * s);
  store_f32(lo, i + half, b * c + a * s);
}

template <typename T>
void rotate(T* x, const int32_t* positions, const RopeTableView& t, int64_t N, int64_t H, int64_t D, float sign,
            int32_t* flag, Stream stream) {
  check(D == t.head_dim && D % 2 == 0, "cuda rope",
        "head_dim " + std::to_string(D) + " != the table's " + std::to_string(t.head_dim) + " (or odd)");
  const int64_t n = N * H * (D / 2);
  if (n == 0) return;
  rope_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(x, positions, t.cos, t.sin, t.max_positions, N, H, D, sign, flag);
  KTUNE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void rope_forward(float* x, const int32_t* positions, const RopeTableView& table, int64_t N, int64_t H, int64_t D,
                  int32_t* flag, Stream stream) {
  rotate(x, positions, table, N, H, D, 1.0f, flag, stream);
}
void rope_forward(bf16_t* x, const int32_t* positions, const RopeTableView& table, int64_t N, int64_t H, int64_t D,
                  int32_t* flag, Stream stream) {
  rotate(dev(x), positions, table, N, H, D, 1.0f, flag, stream);
}
void rope_backward(float* dx, const int32_t* positions, const RopeTableView& table, int64_t N, int64_t H, int64_t D,
                   int32_t* flag, Stream stream) {
  rotate(dx, positions, table, N, H, D, -1.0f, flag, stream);
}
void rope_backward(bf16_t* dx, const int32_t* positions, const RopeTableView& table, int64_t N, int64_t H, int64_t D,
                   int32_t* flag, Stream stream) {
  rotate(dev(dx), positions, table, N, H, D, -1.0f, flag, stream);
}

}  // namespace ktune::cuda
