// The warp-level tensor-core instructions the register-resident kernels use (included by .cu files
// only), as PTX documents them for sm_80 and later: mma.sync m16n8k16 (bf16 inputs, f32
// accumulators), ldmatrix (four 8x8 b16 matrices from shared memory, plain or transposed) and
// cp.async (16-byte global-to-shared copies in commit groups). Unlike wmma (wmma_bf16.cuh), these
// fragments' lane layout is fixed by the ISA, so a kernel may compute on them in registers:
//   lane = 4 g + t (g = lane / 4: the fragment row group, t = lane % 4: the column pair)
//   A (16 x 16, row-major)  a[0] = A(g, 2t..2t+1)   a[1] = A(g+8, 2t..)   a[2] = A(g, 8+2t..)   a[3] = A(g+8, 8+2t..)
//   B (16 x 8, by column)   b[0] = B(2t..2t+1, g)   b[1] = B(8+2t..8+2t+1, g)
//   C, D (16 x 8, f32)      c[0], c[1] = C(g, 2t), C(g, 2t+1)   c[2], c[3] = C(g+8, 2t), C(g+8, 2t+1)
// Each a/b register holds two bf16, the lower column (A) or row (B) index in its low half.
// ldmatrix_x4: lanes 8i .. 8i+7 give the row addresses of matrix i (16 bytes each, 16-byte aligned,
// in shared memory); register r[i] of lane 4g + t receives matrix i's (g, 2t..2t+1), or with
// _trans its (2t..2t+1, g). So an (m, k) row-major tile gives A fragments and a (n, k) one (rows
// n) B fragments plainly, and a (k, n) row-major tile gives B fragments transposed.
// Under the host emulator (fake/cuda_runtime.h defines KTUNE_CUDA_EMULATOR) the same functions come
// from fake/mma_m16n8k16_emulated.h, which exchanges the warp's registers by exactly this layout.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>  // the emulator's defines KTUNE_CUDA_EMULATOR

#include <cstdint>

#if defined(KTUNE_CUDA_EMULATOR)
#include "mma_m16n8k16_emulated.h"
#else
namespace ktune::cuda::ptx {

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Two floats as a bf16 pair (rounded to nearest even): lo in the low half.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
}

// d += A b (16 x 8 += (16 x 16) (16 x 8)), f32 accumulation.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 16 bytes from global src to shared dst, asynchronously; valid false writes 16 zero bytes instead
// (src is then not read, but must still be a valid address).
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most `pending` of this thread's committed groups are still in flight (the others'
// bytes have landed; other threads' copies need a barrier after their own waits).
template <int pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(pending) : "memory");
}

}  // namespace ktune::cuda::ptx
#endif

// Whole 16 x 16 operands of those instructions, from bf16 tiles in shared memory (`tile`: the
// operand's element (0, 0); rows `ld` elements apart, 16-byte aligned), and the accumulator-to-A
// conversion the fused kernels chain products with. Each is one ldmatrix x4 (lane l gives row
// l % 8 of matrix l / 8) and, for the products, two mma.sync over 16 columns.
namespace ktune::cuda::frag {

// Lane l's row within the tile for matrices (rows 0-7, 8-15) x (columns 0-7, 8-15) taken column
// block first (A row-major, B stored by row: matrices 1 and 3 are rows 8-15) ...
__device__ __forceinline__ int row_first_offset(int ld) {
  const int lane = threadIdx.x & 31;
  return ((lane & 7) + (((lane >> 3) & 1) << 3)) * ld + ((lane >> 4) << 3);
}
// ... or row block first (B stored by column, A stored by column: matrices 2 and 3 are rows 8-15).
__device__ __forceinline__ int column_first_offset(int ld) {
  const int lane = threadIdx.x & 31;
  return ((lane & 7) + ((lane >> 4) << 3)) * ld + (((lane >> 3) & 1) << 3);
}

// The A fragment of a row-major (m, k) tile.
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const __nv_bfloat16* tile, int ld) {
  ptx::ldmatrix_x4(a, tile + row_first_offset(ld));
}
// The A fragment of an (m, k) operand stored by column: the tile's rows are k, its columns m.
__device__ __forceinline__ void load_a_columns(uint32_t (&a)[4], const __nv_bfloat16* tile, int ld) {
  ptx::ldmatrix_x4_trans(a, tile + column_first_offset(ld));
}
// lo, hi (its columns n 0-7, 8-15) += A B for a (k, n) B stored by column: the tile's rows are n.
__device__ __forceinline__ void mma_b_columns(float (&lo)[4], float (&hi)[4], const uint32_t (&a)[4],
                                              const __nv_bfloat16* tile, int ld) {
  uint32_t b[4];
  ptx::ldmatrix_x4(b, tile + column_first_offset(ld));
  ptx::mma_bf16_16816(lo, a, b[0], b[1]);
  ptx::mma_bf16_16816(hi, a, b[2], b[3]);
}
// lo, hi (its columns n 0-7, 8-15) += A B for a row-major (k, n) B.
__device__ __forceinline__ void mma_b_rows(float (&lo)[4], float (&hi)[4], const uint32_t (&a)[4],
                                           const __nv_bfloat16* tile, int ld) {
  uint32_t b[4];
  ptx::ldmatrix_x4_trans(b, tile + row_first_offset(ld));
  ptx::mma_bf16_16816(lo, a, b[0], b[1]);
  ptx::mma_bf16_16816(hi, a, b[2], b[3]);
}
// The A fragment of the (16 x 16) product whose columns 0-7 and 8-15 are the accumulator tiles lo
// and hi, rounded to bf16: an accumulator's (g, 2t..2t+1) pairs are an A fragment's.
__device__ __forceinline__ void a_from_accumulators(uint32_t (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
  a[0] = ptx::pack_bf16x2(lo[0], lo[1]), a[1] = ptx::pack_bf16x2(lo[2], lo[3]);
  a[2] = ptx::pack_bf16x2(hi[0], hi[1]), a[3] = ptx::pack_bf16x2(hi[2], hi[3]);
}

}  // namespace ktune::cuda::frag
