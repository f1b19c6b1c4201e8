// Host emulation of src/kernels/cuda/mma_m16n8k16.cuh (its PTX instructions), by the lane layout
// PTX documents and that header restates: mma.sync m16n8k16 (bf16 in, f32 accumulate), ldmatrix
// x4 (plain and .trans) and cp.async 16-byte copies with commit groups.
// mma_bf16_16816 and the ldmatrix loads are warp-collective: every lane deposits its registers (or
// its row address) in the block's exchange slots, waits at a warp barrier (every lane must reach it),
// and reads back what the layout gives it; the product sums its 16 terms in f32, in order (no
// tensor-core rounding). ldmatrix checks that each row address is 16-byte aligned and its 16 bytes
// lie inside the block's shared memory. cp.async checks a 16-byte aligned shared target and an
// aligned source outside shared memory. Under the order and shuffle schedules it holds the copy
// back: it lands only when a cp_async_wait of the same thread covers its group (committed groups
// beyond `pending`, oldest first) — the latest a GPU may complete it — so a read before the wait, or
// by another thread without a barrier after that thread's wait, sees the old bytes (fresh shared
// memory: NaN); copies never waited for are dropped with the block, as the kernel cannot have read
// them. Under reverse and warps (Block::eager_copies) it lands when issued — the earliest — so a
// refill issued while another warp still reads the buffer (a missing barrier before it) shows.
// It deliberately does not emulate other shapes, f16/tf32/int8, x1/x2 ldmatrix, or cp.async's
// 4- and 8-byte forms.
#pragma once
#include <cstdint>
#include <cstring>

#include "cuda_bf16.h"
#include "cuda_runtime.h"

namespace ktune::cuda::ptx {

inline float bf16_bits_to_float(uint32_t bits16) { return __bfloat162float(__nv_bfloat16{uint16_t(bits16)}); }
inline float low_half(uint32_t r) { return bf16_bits_to_float(r & 0xffffu); }
inline float high_half(uint32_t r) { return bf16_bits_to_float(r >> 16); }

inline uint32_t pack_bf16x2(float lo, float hi) {
  return uint32_t(__float2bfloat16_rn(lo).bits) | (uint32_t(__float2bfloat16_rn(hi).bits) << 16);
}

inline bool in_shared(const void* p, size_t bytes) {
  const auto* x = static_cast<const unsigned char*>(p);
  const unsigned char* s = emu::g_block->shared;
  return x >= s && x + bytes <= s + emu::g_block->shared_bytes;
}

// Lane l's row address exchanged, then matrix i's (row, column pair) read as the layout says.
inline void ldmatrix_x4_impl(uint32_t (&r)[4], const void* row, bool trans) {
  if (reinterpret_cast<uintptr_t>(row) % 16 != 0 || !in_shared(row, 16))
    emu::fail("ldmatrix: a row address not 16-byte aligned or not inside the block's shared memory");
  const unsigned char** rows = emu::g_block->rows.data() + emu::warp() * 32;
  const int lane = emu::lane(), g = lane / 4, t = lane % 4;
  rows[lane] = static_cast<const unsigned char*>(row);
  emu::warp_barrier();
  for (int i = 0; i < 4; ++i) {
    uint16_t lo, hi;
    if (!trans) {  // (g, 2t), (g, 2t + 1): row g's bytes 4t .. 4t + 3
      std::memcpy(&lo, rows[8 * i + g] + 4 * t, 2);
      std::memcpy(&hi, rows[8 * i + g] + 4 * t + 2, 2);
    } else {  // (2t, g), (2t + 1, g): column g of rows 2t and 2t + 1
      std::memcpy(&lo, rows[8 * i + 2 * t] + 2 * g, 2);
      std::memcpy(&hi, rows[8 * i + 2 * t + 1] + 2 * g, 2);
    }
    r[i] = uint32_t(lo) | (uint32_t(hi) << 16);
  }
  emu::warp_barrier();  // every lane has read the addresses before a next exchange overwrites them
}
inline void ldmatrix_x4(uint32_t (&r)[4], const void* row) { ldmatrix_x4_impl(r, row, false); }
inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) { ldmatrix_x4_impl(r, row, true); }

inline void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  float* x = emu::g_block->mma.data() + size_t(emu::warp()) * 3 * 256;
  float *A = x, *Bm = x + 256, *C = x + 512;  // A (16, 16), B (16, 8), C (16, 8), row-major
  const int lane = emu::lane(), g = lane / 4, t = lane % 4;
  A[g * 16 + 2 * t] = low_half(a[0]), A[g * 16 + 2 * t + 1] = high_half(a[0]);
  A[(g + 8) * 16 + 2 * t] = low_half(a[1]), A[(g + 8) * 16 + 2 * t + 1] = high_half(a[1]);
  A[g * 16 + 8 + 2 * t] = low_half(a[2]), A[g * 16 + 8 + 2 * t + 1] = high_half(a[2]);
  A[(g + 8) * 16 + 8 + 2 * t] = low_half(a[3]), A[(g + 8) * 16 + 8 + 2 * t + 1] = high_half(a[3]);
  Bm[(2 * t) * 8 + g] = low_half(b0), Bm[(2 * t + 1) * 8 + g] = high_half(b0);
  Bm[(8 + 2 * t) * 8 + g] = low_half(b1), Bm[(8 + 2 * t + 1) * 8 + g] = high_half(b1);
  C[g * 8 + 2 * t] = d[0], C[g * 8 + 2 * t + 1] = d[1], C[(g + 8) * 8 + 2 * t] = d[2], C[(g + 8) * 8 + 2 * t + 1] = d[3];
  emu::warp_barrier();
  float out[4];
  for (int e = 0; e < 4; ++e) {
    const int row = g + (e / 2) * 8, col = 2 * t + e % 2;
    float acc = C[row * 8 + col];
    for (int k = 0; k < 16; ++k) acc += A[row * 16 + k] * Bm[k * 8 + col];
    out[e] = acc;
  }
  emu::warp_barrier();
  for (int e = 0; e < 4; ++e) d[e] = out[e];
}

inline void cp_async_16(void* dst, const void* src, bool valid) {
  if (reinterpret_cast<uintptr_t>(dst) % 16 != 0 || !in_shared(dst, 16))
    emu::fail("cp.async: a target not 16-byte aligned or not inside the block's shared memory");
  if (reinterpret_cast<uintptr_t>(src) % 16 != 0 || in_shared(src, 1))
    emu::fail("cp.async: a source not 16-byte aligned or in shared memory");
  static const unsigned char kZeros[16] = {};
  const unsigned char* from = valid ? static_cast<const unsigned char*>(src) : kZeros;
  if (emu::g_block->eager_copies) {
    std::memcpy(dst, from, 16);
    return;
  }
  auto& f = emu::g_block->fibers[emu::g_block->current];
  f.async_open.push_back({static_cast<unsigned char*>(dst), from});
}
inline void cp_async_commit() {
  auto& f = emu::g_block->fibers[emu::g_block->current];
  f.async_groups.push_back(std::move(f.async_open));
  f.async_open.clear();
}
template <int pending>
void cp_async_wait() {
  auto& f = emu::g_block->fibers[emu::g_block->current];
  while (f.async_groups.size() > size_t(pending)) {
    for (const auto& c : f.async_groups.front()) std::memcpy(c.dst, c.src, 16);
    f.async_groups.erase(f.async_groups.begin());
  }
}

}  // namespace ktune::cuda::ptx
