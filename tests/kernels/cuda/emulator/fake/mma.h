// Host emulation of nvcuda::wmma 16x16x16 (bf16 in, f32 accumulate), the only shape ktune's
// tensor-core kernel uses. The element-to-lane layout of each fragment kind is a fixed random
// permutation (seeded per kind), so code that assumes which lane holds which element breaks here,
// while code that only loads, multiplies and stores works. load/store_matrix_sync check wmma's rules:
// 256-bit aligned pointers, ldm a multiple of 16 bytes, and elements inside the block's shared memory
// when the pointer starts in it. mma_sync exchanges the warp's fragments through the block's slots
// (a warp barrier: every lane must reach it) and sums the 16 products in f32, in order.
// It deliberately does not emulate the tensor cores' rounding (truncated products and a wider,
// unordered accumulation on the device), other fragment shapes, tf32/f16/int8 or matrix_a/b loads
// from an accumulator.
#pragma once
#include <array>
#include <cstdint>
#include <random>
#include <type_traits>

#include "cuda_bf16.h"
#include "cuda_runtime.h"

namespace nvcuda::wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  enum { num_elements = 8 };
  T x[8];
};

template <typename Use, typename Layout>
const std::array<int, 256>& element_map() {
  static const std::array<int, 256> map = [] {
    std::array<int, 256> m;
    for (int i = 0; i < 256; ++i) m[i] = i;
    unsigned seed = 1;
    if (std::is_same_v<Use, matrix_a>) seed += 10;
    if (std::is_same_v<Use, matrix_b>) seed += 20;
    if (std::is_same_v<Layout, col_major>) seed += 1;
    std::mt19937 rng(seed);
    std::shuffle(m.begin(), m.end(), rng);
    return m;
  }();
  return map;
}

template <typename T>
inline void check_pointer(const T* p, unsigned ldm, const char* what) {
  if (reinterpret_cast<uintptr_t>(p) % 32 != 0 || (ldm * sizeof(T)) % 16 != 0) {
    std::fprintf(stderr, "emu: %s: pointer %p not 32-byte aligned or ldm %u not a multiple of 16 bytes\n", what,
                 (const void*)p, ldm);
    std::abort();
  }
}
template <typename T>
inline void check_element(const T* base, const T* e, const char* what) {
  const unsigned char* s = emu::g_block->shared;
  const size_t n = emu::g_block->shared_bytes;
  const auto* b = reinterpret_cast<const unsigned char*>(base);
  const auto* x = reinterpret_cast<const unsigned char*>(e);
  if (b >= s && b < s + n && !(x >= s && x + sizeof(T) <= s + n)) {
    std::fprintf(stderr, "emu: %s reads/writes past shared memory (offset %td of %zu)\n", what, x - s, n);
    std::abort();
  }
}

template <typename Use, typename T, typename Layout>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& f, const T* p, unsigned ldm) {
  check_pointer(p, ldm, "load_matrix_sync");
  const auto& map = element_map<Use, Layout>();
  const int lane = emu::lane();
  for (int e = 0; e < 8; ++e) {
    const int pos = map[lane * 8 + e], r = pos / 16, c = pos % 16;  // a: (m, k); b: (k, n)
    const T* q = std::is_same_v<Layout, row_major> ? p + r * ldm + c : p + c * ldm + r;
    check_element(p, q, "load_matrix_sync");
    f.x[e] = *q;
  }
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p, unsigned ldm, layout_t l) {
  check_pointer(p, ldm, "load_matrix_sync (accumulator)");
  const auto& map = element_map<accumulator, void>();
  const int lane = emu::lane();
  for (int e = 0; e < 8; ++e) {
    const int pos = map[lane * 8 + e], r = pos / 16, c = pos % 16;
    const float* q = l == mem_row_major ? p + r * ldm + c : p + c * ldm + r;
    check_element(p, q, "load_matrix_sync (accumulator)");
    f.x[e] = *q;
  }
}
inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f, unsigned ldm, layout_t l) {
  check_pointer(p, ldm, "store_matrix_sync");
  const auto& map = element_map<accumulator, void>();
  const int lane = emu::lane();
  for (int e = 0; e < 8; ++e) {
    const int pos = map[lane * 8 + e], r = pos / 16, c = pos % 16;
    float* q = l == mem_row_major ? p + r * ldm + c : p + c * ldm + r;
    check_element(p, q, "store_matrix_sync");
    *q = f.x[e];
  }
}
template <typename Use, typename T, typename Layout>
void fill_fragment(fragment<Use, 16, 16, 16, T, Layout>& f, T v) {
  for (int e = 0; e < 8; ++e) f.x[e] = v;
}
inline float as_float(float v) { return v; }
inline float as_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename LA, typename LB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d, const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LA>& a,
              const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LB>& b,
              const fragment<accumulator, 16, 16, 16, float>& c) {
  float* x = emu::g_block->mma.data() + size_t(emu::warp()) * 3 * 256;
  const int lane = emu::lane();
  const auto &ma = element_map<matrix_a, LA>(), &mb = element_map<matrix_b, LB>();
  const auto& mc = element_map<accumulator, void>();
  for (int e = 0; e < 8; ++e) {
    x[ma[lane * 8 + e]] = as_float(a.x[e]);
    x[256 + mb[lane * 8 + e]] = as_float(b.x[e]);
    x[512 + mc[lane * 8 + e]] = c.x[e];
  }
  emu::warp_barrier();
  float out[8];
  for (int e = 0; e < 8; ++e) {
    const int pos = mc[lane * 8 + e], r = pos / 16, col = pos % 16;
    float acc = x[512 + pos];
    for (int k = 0; k < 16; ++k) acc += x[r * 16 + k] * x[256 + k * 16 + col];
    out[e] = acc;
  }
  emu::warp_barrier();
  for (int e = 0; e < 8; ++e) d.x[e] = out[e];
}
}  // namespace nvcuda::wmma
