// The GEMM with NF4 dequantisation fused in (see nf4_gemm.h).
//
// Block (n tile, m tile): C[m0 .. m0 + 63, n0 .. n0 + 63], 128 threads = 4 warps in a 2 x 2 grid,
// warp (wm, wn) owning the 32 x 32 sub-tile at (32 wm, 32 wn) as 2 x 2 accumulator fragments.
// For each k0 = 0, 32, .. < K:
//   A tile (64 x 32 bf16) -> shared a_s[m][k]          (rows past M read as 0)
//   B tile (32 x 64) dequantised from W's codes -> shared, in W's own orientation:
//     w_transposed:  b_s[n][k] = W[n0 + n, k0 + k]    (B fragments col_major: B(k, n) = b_s[n * ld + k])
//     otherwise:     b_s[k][n] = W[k0 + k, n0 + n]    (B fragments row_major: B(k, n) = b_s[k * ld + n])
//   each warp: acc += A frags x B frags over the tile's two 16-deep slices
// Then the accumulators go to shared f32 (c_s) and every thread writes its elements of C:
// alpha * acc [+ beta * C] [+ bias], rounded to C's dtype.
// Each thread dequantises 16 consecutive values of one row of W (8 code bytes, one block scale: 16
// values aligned to 16 never straddle a 64-block when the row length is a multiple of 64).
#include "kernels/cuda/nf4_gemm.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <string>

#include "core/error.h"
#include "kernels/cpu/nf4.h"  // KTUNE_NF4_CODE_VALUES_BF16, kNf4BlockSize (plain header)
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/wmma_bf16.cuh"

namespace ktune::cuda {
namespace {

using namespace wmma_bf16;  // wmma, bf16, FragA, FragAColumns, FragB, FragBColumns, Acc

__constant__ float kCodes[16] = KTUNE_NF4_CODE_VALUES_BF16;  // the CPU's kNf4CodesBf16

constexpr int kBM = 64, kBN = 64, kBK = 32, kThreads = 128;
constexpr int kLdA = kBK + 8;   // a_s[m][k]; +8 bf16 keeps wmma's 32-byte alignment and spreads banks
constexpr int kLdBt = kBK + 8;  // b_s[n][k] (w_transposed)
constexpr int kLdB = kBN + 8;   // b_s[k][n]
constexpr int kLdC = kBN + 4;   // c_s[m][n], f32
constexpr int kBSize = kBN * kLdBt > kBK * kLdB ? kBN * kLdBt : kBK * kLdB;
// Shared memory, one dynamic block (within the default 48 KiB), each part 128-byte aligned.
constexpr int kOffsetB = (kBM * kLdA * 2 + 127) / 128 * 128;
constexpr int kOffsetC = kOffsetB + (kBSize * 2 + 127) / 128 * 128;
constexpr int kSharedBytes = kOffsetC + kBM * kLdC * 4;
static_assert(kSharedBytes <= 48 * 1024, "beyond the default dynamic shared memory");
static_assert(kThreads * 16 == kBM * kBK, "each thread loads 16 values of A");
static_assert(kThreads * 16 == kBN * kBK, "each thread dequantises 16 values of W");

// a_s[m][k] = A[m0 + m, k0 + k], (64 x 32); thread t: row t / 2, columns 16 (t % 2) .. + 15.
__device__ __forceinline__ void load_a_tile(bf16* a_s, const bf16* A, int64_t M, int64_t K, int64_t m0, int64_t k0) {
  const int row = threadIdx.x / 2, col = 16 * (threadIdx.x % 2);
  uint4* dst = reinterpret_cast<uint4*>(a_s + row * kLdA + col);
  if (m0 + row < M) {
    const uint4* src = reinterpret_cast<const uint4*>(A + (m0 + row) * K + k0 + col);
    dst[0] = src[0];
    dst[1] = src[1];
  } else {
    dst[0] = make_uint4(0, 0, 0, 0);
    dst[1] = make_uint4(0, 0, 0, 0);
  }
}

// out[0 .. 15] = W's flattened elements first .. first + 15 (first a multiple of 16), dequantised
// and rounded to bf16 as nf4_dequantize does.
__device__ __forceinline__ void dequantize_16(bf16* out, const uint8_t* codes, const bf16* scales, int64_t first) {
  const float scale = __bfloat162float(scales[first / cpu::kNf4BlockSize]);
  const uint8_t* bytes = codes + first / 2;
  for (int j = 0; j < 8; ++j) {
    const uint8_t byte = bytes[j];
    out[2 * j] = __float2bfloat16_rn(kCodes[byte >> 4] * scale);  // first value: high nibble
    out[2 * j + 1] = __float2bfloat16_rn(kCodes[byte & 0x0f] * scale);
  }
}

// The B tile of k0 in W's orientation (see the top of the file).
template <bool kWTransposed>
__device__ __forceinline__ void dequantize_b_tile(bf16* b_s, const uint8_t* codes, const bf16* scales, int64_t N,
                                                  int64_t K, int64_t n0, int64_t k0) {
  if (kWTransposed) {  // W (N, K): thread t: W row n0 + t / 2, columns k0 + 16 (t % 2) .. + 15
    const int n = threadIdx.x / 2, k = 16 * (threadIdx.x % 2);
    dequantize_16(b_s + n * kLdBt + k, codes, scales, (n0 + n) * K + k0 + k);
  } else {  // W (K, N): thread t: W row k0 + t / 4, columns n0 + 16 (t % 4) .. + 15
    const int k = threadIdx.x / 4, n = 16 * (threadIdx.x % 4);
    dequantize_16(b_s + k * kLdB + n, codes, scales, (k0 + k) * N + n0 + n);
  }
}

template <typename TC, bool kWTransposed>
__global__ void __launch_bounds__(kThreads) nf4_gemm_kernel(TC* C, const bf16* A, const uint8_t* codes,
                                                            const bf16* scales, const TC* bias, int64_t M, int64_t N,
                                                            int64_t K, float alpha, float beta) {
  extern __shared__ __align__(128) unsigned char smem[];  // kSharedBytes: a_s | b_s | c_s
  bf16* a_s = reinterpret_cast<bf16*>(smem);
  bf16* b_s = reinterpret_cast<bf16*>(smem + kOffsetB);
  float* c_s = reinterpret_cast<float*>(smem + kOffsetC);
  const int64_t m0 = int64_t(blockIdx.y) * kBM, n0 = int64_t(blockIdx.x) * kBN;
  const int warp = threadIdx.x / 32, wm = warp / 2, wn = warp % 2;

  Acc acc[2][2];
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

  for (int64_t k0 = 0; k0 < K; k0 += kBK) {
    load_a_tile(a_s, A, M, K, m0, k0);
    dequantize_b_tile<kWTransposed>(b_s, codes, scales, N, K, n0, k0);
    __syncthreads();
    for (int kk = 0; kk < kBK; kk += 16) {
      FragA a[2];
      for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(a[i], a_s + (32 * wm + 16 * i) * kLdA + kk, kLdA);
      for (int j = 0; j < 2; ++j) {
        const int n = 32 * wn + 16 * j;
        if (kWTransposed) {
          FragBColumns b;
          wmma::load_matrix_sync(b, b_s + n * kLdBt + kk, kLdBt);
          for (int i = 0; i < 2; ++i) wmma::mma_sync(acc[i][j], a[i], b, acc[i][j]);
        } else {
          FragB b;
          wmma::load_matrix_sync(b, b_s + kk * kLdB + n, kLdB);
          for (int i = 0; i < 2; ++i) wmma::mma_sync(acc[i][j], a[i], b, acc[i][j]);
        }
      }
    }
    __syncthreads();  // the next tile overwrites a_s and b_s
  }

  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j)
      wmma::store_matrix_sync(c_s + (32 * wm + 16 * i) * kLdC + 32 * wn + 16 * j, acc[i][j], kLdC,
                              wmma::mem_row_major);
  __syncthreads();
  for (int e = threadIdx.x; e < kBM * kBN; e += kThreads) {
    const int r = e / kBN, c = e % kBN;
    const int64_t m = m0 + r, n = n0 + c;
    if (m >= M) continue;
    float v = alpha * c_s[r * kLdC + c];
    if (beta != 0.0f) v += beta * load_f32(C, m * N + n);
    if (bias) v += load_f32(bias, n);
    store_f32(C, m * N + n, v);
  }
}

template <typename TC>
void launch(const Nf4GemmCall& g, Stream stream) {
  const dim3 grid(unsigned(g.N / kBN), unsigned((g.M + kBM - 1) / kBM));
  auto* C = static_cast<TC*>(g.C);
  const auto* bias = static_cast<const TC*>(g.bias);
  const auto* A = reinterpret_cast<const bf16*>(g.A);
  const auto* scales = reinterpret_cast<const bf16*>(g.scales);
  if (g.w_transposed)
    nf4_gemm_kernel<TC, true><<<grid, kThreads, kSharedBytes, stream>>>(C, A, g.codes, scales, bias, g.M, g.N,
                                                                     g.K, g.alpha, g.beta);
  else
    nf4_gemm_kernel<TC, false><<<grid, kThreads, kSharedBytes, stream>>>(C, A, g.codes, scales, bias, g.M, g.N,
                                                                     g.K, g.alpha, g.beta);
  KTUNE_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool nf4_gemm_supports(int64_t N, int64_t K) { return N > 0 && K > 0 && N % 64 == 0 && K % 64 == 0; }

void nf4_gemm(const Nf4GemmCall& g, Stream stream) {
  const std::string where = "cuda nf4 gemm";
  check(nf4_gemm_supports(g.N, g.K), where,
        "N = " + std::to_string(g.N) + " and K = " + std::to_string(g.K) + " must be positive multiples of 64");
  check(g.M >= 0 && g.M / kBM < 65535, where, "M = " + std::to_string(g.M) + " out of range");
  check(g.A && g.codes && g.scales && g.C, where, "a null pointer (A, codes, scales or C)");
  check(reinterpret_cast<uintptr_t>(g.A) % 16 == 0, where, "A must be 16-byte aligned");
  check(g.out == DType::F32 || g.out == DType::BF16, where, "C must be F32 or BF16");
  if (g.M == 0) return;
  if (g.out == DType::F32)
    launch<float>(g, stream);
  else
    launch<bf16>(g, stream);
}

}  // namespace ktune::cuda
