// Fused causal attention on the tensor cores (see flash_attention_tc.h).
//
// Every product is a warp's wmma bf16 16x16x16 fragments read from shared memory (f32
// accumulators); every elementwise step (mask, softmax, dS) runs on f32 tiles in shared memory that
// a fragment was stored to, so no code depends on which lane holds which fragment element — with
// one exception made safe: the forward rescales its output accumulators per row, and reads each
// element's row from a fragment loaded from a table of row numbers (same fragment type, same layout).
//
// Forward, block (query tile qt, b * Hq + h), 4 warps; warp w owns query rows q0 + 16w .. + 15:
//   for each key tile k0 = k_begin, .. + 64, .. <= q0 (the diagonal tile last; the ones above it are
//   skipped; k_begin: the tile of the block's first query's first key in the window, q0 - window + 1,
//   and of its smallest first_key with DocumentBounds, whichever is later; else 0):
//     S (16 x 64) = Q_w K^T            -> shared (f32), read back scaled, soft-capped (cap tanh(s / cap));
//                                         masked (j > i or j >= T, i - window >= j, or doc[j] != doc[i]:
//                                         -inf) on the diagonal and last tiles and those reaching back
//                                         past a row's window only, on every tile with doc ids (a tile
//                                         may then mask a whole row)
//     m' = max(m, rowmax S); P = exp(S - m') (bf16 to shared); l = l e^(m - m') + rowsum P
//     O = O e^(m - m') + P V           (O: D/16 accumulator fragments in registers)
//   out = O / l, lse = m + log l.  Lane 2r + half holds row r's m and l (both lanes of the pair).
// Backward, block (key tile, b * Hkv + kvh), W warps (W = 4 for D = 64, 8 for D = 128; 16W keys);
// warp w owns key rows k0 + 16w .. + 15. For each query head h of the group and each 64-query tile
// i0 >= k0 (tiles below are fully masked) up to i_end (T; with a window k0 + 16W - 1 + window, past
// which no query sees the block's last key; with DocumentBounds the end of the tile of the block's
// largest last_query; the least of these: the tiles after it are fully masked too):
//     S^T = K_w Q^T, dP^T = V_w dO^T   (16 x 64 each, f32 to shared)
//     s' = cap(scale S^T), P^T = exp(s' - lse_i), dS^T = P^T (dP^T - delta_i) (1 - (s'/cap)^2) scale
//                                      (the cap's factor only with a cap; masked, window and doc ids
//                                       too: 0; bf16)
//     dV_w += P^T dO, dK_w += dS^T Q   (accumulator fragments in registers, over all heads and tiles)
//     dQ (64 x D) += dS K              (block-wide, fragments split over the warps, float4 atomicAdd)
// delta = rowsum(dout * out) comes first (its own kernel), dq is rounded to bf16 last.
// Skipping by DocumentBounds or the window is exact: a fully masked tile leaves the forward's m = -inf,
// l = 0 and O = 0 as they were (the tiles skipped all come before any visible key), and adds only zeros to
// dK, dV and dQ (P = dS = 0), so out, lse, dk, dv are the same bit for bit (dq too, up to the order
// of its atomics). A skipped tile's NaN or Inf (rows of other documents) no longer reaches the results,
// as a masked one's does (P = 0 times NaN V is NaN).
#include "kernels/cuda/flash_attention_tc.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <string>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/wmma_bf16.cuh"
#include "kernels/cuda/document_bounds.cuh"

namespace ktune::cuda {
namespace {

using namespace wmma_bf16;  // wmma, bf16, FragA, FragAColumns, FragB, FragBColumns, Acc

constexpr int kTile = 64;           // queries per forward block, keys per forward tile, queries per backward tile
constexpr int kForwardWarps = kTile / 16;
constexpr int kLdScore = kTile + 4;  // f32 row stride of a warp's 16 x 64 score tile (wmma: multiple of 4)
constexpr int kLdProb = kTile + 8;   // bf16 row stride of 16 x 64 P / dS tiles (wmma: multiple of 8)

constexpr size_t align128(size_t n) { return (n + 127) / 128 * 128; }

// Byte offsets into the forward block's dynamic shared memory. Row strides of D + 8 bf16 keep
// every 16-row, 16-column fragment start 32-byte aligned (as wmma requires) and shift the banks.
template <int D>
struct ForwardLayout {
  static constexpr int kLd = D + 8;
  static constexpr size_t q = 0;                                               // (64, D+8) bf16
  static constexpr size_t k = q + align128(size_t(kTile) * kLd * 2);           // (64, D+8) bf16
  static constexpr size_t v = k + align128(size_t(kTile) * kLd * 2);           // (64, D+8) bf16
  static constexpr size_t s = v + align128(size_t(kTile) * kLd * 2);           // (4 warps, 16, 68) f32
  static constexpr size_t p = s + align128(size_t(kForwardWarps) * 16 * kLdScore * 4);  // (4, 16, 72) bf16
  static constexpr size_t row_scale = p + align128(size_t(kForwardWarps) * 16 * kLdProb * 2);  // (64) f32
  static constexpr size_t rows = row_scale + align128(size_t(kTile) * 4);     // (16, 16) f32: r at (r, c)
  static constexpr size_t bytes = rows + align128(16 * 16 * 4);
};

// The backward block's: W warps, 16 W keys.
template <int D, int W>
struct BackwardLayout {
  static constexpr int kLd = D + 8, kKeys = 16 * W;
  static constexpr size_t k = 0;                                               // (16W, D+8) bf16
  static constexpr size_t v = k + align128(size_t(kKeys) * kLd * 2);           // (16W, D+8) bf16
  static constexpr size_t q = v + align128(size_t(kKeys) * kLd * 2);           // (64, D+8) bf16
  static constexpr size_t dout = q + align128(size_t(kTile) * kLd * 2);        // (64, D+8) bf16
  static constexpr size_t lse = dout + align128(size_t(kTile) * kLd * 2);      // (64) f32
  static constexpr size_t delta = lse + align128(kTile * 4);                   // (64) f32
  static constexpr size_t st = delta + align128(kTile * 4);                    // (W, 16, 68) f32 S^T
  static constexpr size_t dpt = st + align128(size_t(W) * 16 * kLdScore * 4);  // (W, 16, 68) f32 dP^T
  static constexpr size_t pt = dpt + align128(size_t(W) * 16 * kLdScore * 4);  // (W, 16, 72) bf16 P^T
  static constexpr size_t dst = pt + align128(size_t(W) * 16 * kLdProb * 2);   // (16W, 72) bf16 dS^T
  static constexpr size_t bytes = dst + align128(size_t(kKeys) * kLdProb * 2);
};

constexpr int kBackwardWarps64 = 4, kBackwardWarps128 = 8;
constexpr size_t kMaxSharedBytes = 227 * 1024;  // per block on sm_90 (opt-in)
static_assert(ForwardLayout<128>::bytes <= kMaxSharedBytes, "forward tiles exceed shared memory");
static_assert(BackwardLayout<64, kBackwardWarps64>::bytes <= kMaxSharedBytes, "backward D=64 tiles too large");
static_assert(BackwardLayout<128, kBackwardWarps128>::bytes <= kMaxSharedBytes, "backward D=128 tiles too large");

struct Params {
  int64_t B, T, Hq, Hkv;
  int64_t window;  // key j visible to query i only if i - window < j (0: no window)
  float scale;
  float softcap;   // s' = softcap tanh(s / softcap) on the scaled score (0: none)
  const int32_t* doc;  // (B, T) document ids, or nullptr (causal only)
  const int32_t* first_key;   // (B, T) DocumentBounds, or nullptr (every key tile from 0)
  const int32_t* last_query;  // (B, T) DocumentBounds, or nullptr (every query tile to T)
};

// Rows first .. first+rows-1 of head h of a (B, T, H, D) bf16 tensor into dst (rows, D+8), 16 bytes
// a thread at a time; rows >= T read as 0. Needs src 16-byte aligned (checked on the host).
template <int D>
__device__ void load_tile(bf16* dst, const bf16* src, int64_t b, int64_t first, int rows, int64_t h, int64_t H,
                          int64_t T) {
  constexpr int kChunks = D / 8;  // 8 bf16 per uint4
  for (int e = threadIdx.x; e < rows * kChunks; e += blockDim.x) {
    const int r = e / kChunks, c = e % kChunks;
    const int64_t i = first + r;
    uint4 value = make_uint4(0u, 0u, 0u, 0u);
    if (i < T) value = *reinterpret_cast<const uint4*>(src + ((b * T + i) * H + h) * D + c * 8);
    *reinterpret_cast<uint4*>(dst + r * (D + 8) + c * 8) = value;
  }
}

// A warp's 16 x D f32 result (frags[f] = columns 16f .. 16f+15) as bf16 rows first .. first+15 (those
// < T) of head h of a (B, T, H, D) tensor, 64 columns at a time through the warp's (16, 68) f32 staging.
template <int D>
__device__ void store_rows_bf16(bf16* dst, Acc (&frags)[D / 16], float* staging, int64_t b, int64_t first,
                                int64_t h, int64_t H, int64_t T) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int c0 = 0; c0 < D; c0 += 64) {
    __syncwarp();  // the staging tile's previous contents are read
#pragma unroll
    for (int f = 0; f < 4; ++f) wmma::store_matrix_sync(staging + 16 * f, frags[c0 / 16 + f], kLdScore, wmma::mem_row_major);
    __syncwarp();
    for (int e = lane; e < 16 * 64; e += 32) {
      const int r = e / 64, c = e % 64;
      const int64_t i = first + r;
      if (i < T) dst[((b * T + i) * H + h) * D + c0 + c] = __float2bfloat16_rn(staging[r * kLdScore + c]);
    }
  }
  __syncwarp();
}

// Blocks an SM holds by shared memory (ForwardLayout: 54 KiB at D = 64, 78 KiB at D = 128); the
// register budget follows (at D = 64, four blocks leave 128 registers a thread).
template <int D>
__global__ void __launch_bounds__(kForwardWarps * 32, D == 64 ? 4 : 2)
    forward_kernel(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, Params p) {
  using L = ForwardLayout<D>;
  constexpr int kLd = L::kLd;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* q_s = reinterpret_cast<bf16*>(smem + L::q);
  bf16* k_s = reinterpret_cast<bf16*>(smem + L::k);
  bf16* v_s = reinterpret_cast<bf16*>(smem + L::v);
  float* rows_s = reinterpret_cast<float*>(smem + L::rows);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float* s_w = reinterpret_cast<float*>(smem + L::s) + warp * 16 * kLdScore;     // (16, 68) this warp's S
  bf16* p_w = reinterpret_cast<bf16*>(smem + L::p) + warp * 16 * kLdProb;        // (16, 72) this warp's P
  float* scale_w = reinterpret_cast<float*>(smem + L::row_scale) + warp * 16;    // (16) per-row factors

  const int64_t b = blockIdx.y / p.Hq, h = blockIdx.y % p.Hq, kvh = h / (p.Hq / p.Hkv);
  // The longest rows (most key tiles) first: block x = 0 takes the last query tile.
  const int64_t n_tiles = (p.T + kTile - 1) / kTile, q0 = (n_tiles - 1 - int64_t(blockIdx.x)) * kTile;
  for (int e = threadIdx.x; e < 16 * 16; e += blockDim.x) rows_s[e] = float(e / 16);
  load_tile<D>(q_s, q, b, q0, kTile, h, p.Hq, p.T);
  __syncthreads();

  Acc row_of;  // row_of.x[e]: the row (0..15) of element e of any Acc this lane holds
  wmma::load_matrix_sync(row_of, rows_s, 16, wmma::mem_row_major);
  FragA qf[D / 16];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) wmma::load_matrix_sync(qf[kk], q_s + warp * 16 * kLd + kk * 16, kLd);
  Acc o[D / 16];
#pragma unroll
  for (int n = 0; n < D / 16; ++n) wmma::fill_fragment(o[n], 0.0f);

  const int r = lane >> 1, half = lane & 1;  // this lane's softmax row, and its columns 2t + half
  const int64_t i = q0 + warp * 16 + r;
  // Row i's document (rows past T, never stored, keep the causal mask only).
  const bool doc_row = p.doc && i < p.T;
  const int32_t doc_i = doc_row ? p.doc[b * p.T + i] : 0;
  float m = -INFINITY, l = 0.0f;
  const int64_t k_end = min(p.T, q0 + kTile);  // keys past the tile's last query are never visible
  // Keys before the window of the block's first query, or before its first document start, are never
  // visible (k_begin <= q0: the diagonal tile runs).
  int64_t k_lo = p.window > 0 ? max(int64_t(0), q0 - p.window + 1) : 0;
  if (p.first_key) k_lo = max(k_lo, block_first_key(p.first_key, b, p.T, q0, kTile));
  const int64_t k_begin = k_lo / kTile * kTile;
  for (int64_t k0 = k_begin; k0 < k_end; k0 += kTile) {
    __syncthreads();  // every warp is done with the previous K, V tiles
    load_tile<D>(k_s, k, b, k0, kTile, kvh, p.Hkv, p.T);
    load_tile<D>(v_s, v, b, k0, kTile, kvh, p.Hkv, p.T);
    __syncthreads();
    // S (16 x 64) = Q_w K^T
#pragma unroll
    for (int n = 0; n < kTile / 16; ++n) {
      Acc acc;
      wmma::fill_fragment(acc, 0.0f);
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        FragBColumns kf;
        wmma::load_matrix_sync(kf, k_s + n * 16 * kLd + kk * 16, kLd);
        wmma::mma_sync(acc, qf[kk], kf, acc);
      }
      wmma::store_matrix_sync(s_w + n * 16, acc, kLdScore, wmma::mem_row_major);
    }
    __syncwarp();
    // Online softmax of row r over this lane's 32 columns and its partner's. Only the diagonal
    // tile, the last one and (with a window) those reaching back past a row's window hold keys this
    // row must not see: the others skip the mask. The warp's last row k0 + 16w + 15 sees key k0 iff
    // k0 > that row - window.
    const float* srow = s_w + r * kLdScore;
    const int64_t warp_last_row = q0 + warp * 16 + 15;
    const bool masked = p.doc != nullptr || k0 + kTile - 1 > q0 + warp * 16 || k0 + kTile > p.T ||
                        (p.window > 0 && k0 <= warp_last_row - p.window);  // uniform over the warp
    // cap(scale * S[r, c]), or -inf where key k0 + c is not visible to row i (capped before the mask)
    auto score = [&](int c) {
      const int64_t j = k0 + c;
      const bool visible = j <= i && j < p.T && (p.window == 0 || i - p.window < j) &&
                           (!doc_row || p.doc[b * p.T + j] == doc_i);
      float t;
      return (!masked || visible) ? softcap_score(srow[c] * p.scale, p.softcap, &t) : -INFINITY;
    };
    float x[kTile / 2];  // this lane's scores, read from shared memory once
    float tile_max = -INFINITY;
#pragma unroll
    for (int t = 0; t < kTile / 2; ++t) {
      x[t] = score(2 * t + half);
      tile_max = fmaxf(tile_max, x[t]);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    const float m_new = fmaxf(m, tile_max);
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // a row with nothing visible yet keeps P = 0
    float sum = 0.0f;
    bf16* prow = p_w + r * kLdProb;
#pragma unroll
    for (int t = 0; t < kTile / 2; ++t) {
      const float pv = __expf(x[t] - m_use);
      sum += pv;
      prow[2 * t + half] = __float2bfloat16_rn(pv);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    const float alpha = __expf(m - m_use);  // 0 while m = -inf
    l = l * alpha + sum;
    m = m_new;
    if (half == 0) scale_w[r] = alpha;
    __syncwarp();
    // O = O alpha_row + P V
#pragma unroll
    for (int n = 0; n < D / 16; ++n)
#pragma unroll
      for (int e = 0; e < Acc::num_elements; ++e) o[n].x[e] *= scale_w[int(row_of.x[e])];
    FragA pf[kTile / 16];
#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk) wmma::load_matrix_sync(pf[kk], p_w + kk * 16, kLdProb);
#pragma unroll
    for (int n = 0; n < D / 16; ++n)
#pragma unroll
      for (int kk = 0; kk < kTile / 16; ++kk) {
        FragB vf;
        wmma::load_matrix_sync(vf, v_s + kk * 16 * kLd + n * 16, kLd);
        wmma::mma_sync(o[n], pf[kk], vf, o[n]);
      }
  }
  __syncwarp();  // the last tile's reads of scale_w and s_w are done
  if (half == 0) scale_w[r] = 1.0f / l;
  if (half == 0 && i < p.T) lse[(b * p.Hq + h) * p.T + i] = m + logf(l);
  __syncwarp();
#pragma unroll
  for (int n = 0; n < D / 16; ++n)
#pragma unroll
    for (int e = 0; e < Acc::num_elements; ++e) o[n].x[e] *= scale_w[int(row_of.x[e])];
  store_rows_bf16<D>(out, o, s_w, b, q0 + warp * 16, h, p.Hq, p.T);
}

// delta (B, Hq, T) = rowsum(dout * out) in f32: a warp per (b, i, h) row, in storage order.
__global__ void delta_kernel(float* delta, const bf16* dout, const bf16* out, int64_t rows, int64_t T, int64_t Hq,
                             int64_t D) {
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  float acc = 0.0f;
  for (int64_t d = lane; d < D; d += 32) acc += __bfloat162float(dout[row * D + d]) * __bfloat162float(out[row * D + d]);
  acc = warp_sum(acc);
  if (lane == 0) {
    const int64_t h = row % Hq, bi = row / Hq, b = bi / T, i = bi % T;
    delta[(b * Hq + h) * T + i] = acc;
  }
}

template <int D, int W>
__global__ void __launch_bounds__(W * 32)
    backward_kernel(bf16* dk, bf16* dv, float* dq_acc, const bf16* dout, const bf16* q, const bf16* k, const bf16* v,
                    const float* lse, const float* delta, Params p) {
  using L = BackwardLayout<D, W>;
  constexpr int kLd = L::kLd, kKeys = L::kKeys;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* k_s = reinterpret_cast<bf16*>(smem + L::k);
  bf16* v_s = reinterpret_cast<bf16*>(smem + L::v);
  bf16* q_s = reinterpret_cast<bf16*>(smem + L::q);
  bf16* do_s = reinterpret_cast<bf16*>(smem + L::dout);
  float* lse_s = reinterpret_cast<float*>(smem + L::lse);
  float* delta_s = reinterpret_cast<float*>(smem + L::delta);
  bf16* dst_s = reinterpret_cast<bf16*>(smem + L::dst);  // (16W keys, 72): dS^T of the whole block
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float* st_w = reinterpret_cast<float*>(smem + L::st) + warp * 16 * kLdScore;    // (16, 68) S^T of warp's keys
  float* dpt_w = reinterpret_cast<float*>(smem + L::dpt) + warp * 16 * kLdScore;  // (16, 68) dP^T
  bf16* pt_w = reinterpret_cast<bf16*>(smem + L::pt) + warp * 16 * kLdProb;       // (16, 72) P^T

  const int64_t b = blockIdx.y / p.Hkv, kvh = blockIdx.y % p.Hkv, group = p.Hq / p.Hkv;
  const int64_t k0 = int64_t(blockIdx.x) * kKeys;
  load_tile<D>(k_s, k, b, k0, kKeys, kvh, p.Hkv, p.T);
  load_tile<D>(v_s, v, b, k0, kKeys, kvh, p.Hkv, p.T);
  Acc dk_acc[D / 16], dv_acc[D / 16];
#pragma unroll
  for (int n = 0; n < D / 16; ++n) wmma::fill_fragment(dk_acc[n], 0.0f), wmma::fill_fragment(dv_acc[n], 0.0f);
  const int r = lane >> 1, half = lane & 1;  // this lane's key row of the warp, and its columns 2t + half
  const int64_t j = k0 + warp * 16 + r;
  const int32_t doc_j = p.doc && j < p.T ? p.doc[b * p.T + j] : 0;  // key row j's document
  // The warp's K and V rows as A fragments, loaded once where registers allow (D = 64; at D = 128
  // they would spill, and are reloaded from shared memory for every tile instead).
  constexpr bool kHoistKv = D <= 64;
  FragA kw[kHoistKv ? D / 16 : 1], vw[kHoistKv ? D / 16 : 1];
  if constexpr (kHoistKv) {
    __syncthreads();  // K, V tiles in place
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      wmma::load_matrix_sync(kw[kk], k_s + warp * 16 * kLd + kk * 16, kLd);
      wmma::load_matrix_sync(vw[kk], v_s + warp * 16 * kLd + kk * 16, kLd);
    }
  }

  // Queries at or past the window's end for the block's last key (k0 + 16W - 1 + window), or after the
  // block's last document end, see none of its keys (i_end > k0: the first tile runs).
  int64_t i_end = p.window > 0 ? min(p.T, k0 + kKeys - 1 + p.window) : p.T;
  if (p.last_query) i_end = min(i_end, block_last_query(p.last_query, b, p.T, k0, kKeys) + 1);
  for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
    // k0 is a multiple of 64: query tiles below it see none of these keys.
    for (int64_t i0 = k0; i0 < i_end; i0 += kTile) {
      __syncthreads();  // the previous tile's Q, dO, lse, delta and dS^T are no longer read
      load_tile<D>(q_s, q, b, i0, kTile, h, p.Hq, p.T);
      load_tile<D>(do_s, dout, b, i0, kTile, h, p.Hq, p.T);
      for (int e = threadIdx.x; e < kTile; e += blockDim.x) {
        const int64_t i = i0 + e;
        lse_s[e] = i < p.T ? lse[(b * p.Hq + h) * p.T + i] : 0.0f;
        delta_s[e] = i < p.T ? delta[(b * p.Hq + h) * p.T + i] : 0.0f;
      }
      __syncthreads();
      // S^T = K_w Q^T and dP^T = V_w dO^T (16 keys x 64 queries)
#pragma unroll
      for (int n = 0; n < kTile / 16; ++n) {
        Acc s_acc, dp_acc;
        wmma::fill_fragment(s_acc, 0.0f);
        wmma::fill_fragment(dp_acc, 0.0f);
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
          FragBColumns qf, dof;
          wmma::load_matrix_sync(qf, q_s + n * 16 * kLd + kk * 16, kLd);
          wmma::load_matrix_sync(dof, do_s + n * 16 * kLd + kk * 16, kLd);
          if constexpr (kHoistKv) {
            wmma::mma_sync(s_acc, kw[kk], qf, s_acc);
            wmma::mma_sync(dp_acc, vw[kk], dof, dp_acc);
          } else {
            FragA kf, vf;
            wmma::load_matrix_sync(kf, k_s + warp * 16 * kLd + kk * 16, kLd);
            wmma::mma_sync(s_acc, kf, qf, s_acc);
            wmma::load_matrix_sync(vf, v_s + warp * 16 * kLd + kk * 16, kLd);
            wmma::mma_sync(dp_acc, vf, dof, dp_acc);
          }
        }
        wmma::store_matrix_sync(st_w + n * 16, s_acc, kLdScore, wmma::mem_row_major);
        wmma::store_matrix_sync(dpt_w + n * 16, dp_acc, kLdScore, wmma::mem_row_major);
      }
      __syncwarp();
      // P^T and dS^T of key row r (masked entries 0)
      const float* srow = st_w + r * kLdScore;
      const float* dprow = dpt_w + r * kLdScore;
      bf16* prow = pt_w + r * kLdProb;
      bf16* dsrow = dst_s + (warp * 16 + r) * kLdProb;
      for (int t = 0; t < kTile / 2; ++t) {
        const int c = 2 * t + half;
        const int64_t i = i0 + c;
        float pv = 0.0f, ds = 0.0f;
        if (j <= i && i < p.T && j < p.T && (p.window == 0 || i - p.window < j) &&
            (!p.doc || p.doc[b * p.T + i] == doc_j)) {
          float t;  // the cap's tanh: ds takes its derivative 1 - t^2 (attention.cu's order)
          const float sc = softcap_score(srow[c] * p.scale, p.softcap, &t);
          pv = __expf(sc - lse_s[c]);
          ds = pv * (dprow[c] - delta_s[c]);
          if (p.softcap > 0.0f) ds *= 1.0f - t * t;
          ds *= p.scale;
        }
        prow[c] = __float2bfloat16_rn(pv);
        dsrow[c] = __float2bfloat16_rn(ds);
      }
      __syncwarp();
      // dV_w += P^T dO, dK_w += dS^T Q
#pragma unroll
      for (int kk = 0; kk < kTile / 16; ++kk) {
        FragA pa, dsa;
        wmma::load_matrix_sync(pa, pt_w + kk * 16, kLdProb);
        wmma::load_matrix_sync(dsa, dst_s + warp * 16 * kLdProb + kk * 16, kLdProb);
#pragma unroll
        for (int n = 0; n < D / 16; ++n) {
          FragB dob, qb;
          wmma::load_matrix_sync(dob, do_s + kk * 16 * kLd + n * 16, kLd);
          wmma::mma_sync(dv_acc[n], pa, dob, dv_acc[n]);
          wmma::load_matrix_sync(qb, q_s + kk * 16 * kLd + n * 16, kLd);
          wmma::mma_sync(dk_acc[n], dsa, qb, dk_acc[n]);
        }
      }
      __syncthreads();  // every warp's rows of dS^T are in place
      // dQ (64 x D) += dS K: output fragment f = (query block f / (D/16), column block f % (D/16)),
      // the warp's are f = warp, warp + W, ...; added to dq_acc through the warp's S^T tile.
      for (int f = warp; f < (kTile / 16) * (D / 16); f += W) {
        const int mb = f / (D / 16), nb = f % (D / 16);
        Acc acc;
        wmma::fill_fragment(acc, 0.0f);
#pragma unroll
        for (int kk = 0; kk < kKeys / 16; ++kk) {
          FragAColumns dsf;
          FragB kb;
          wmma::load_matrix_sync(dsf, dst_s + kk * 16 * kLdProb + mb * 16, kLdProb);
          wmma::load_matrix_sync(kb, k_s + kk * 16 * kLd + nb * 16, kLd);
          wmma::mma_sync(acc, dsf, kb, acc);
        }
        __syncwarp();  // the staging tile's previous contents are read
        wmma::store_matrix_sync(st_w, acc, kLdScore, wmma::mem_row_major);
        __syncwarp();
        // Four floats an atomic (sm_90's vector atomicAdd; dq_acc is 16-byte aligned, D a multiple of 4).
        for (int e = lane; e < 16 * 4; e += 32) {
          const int rr = e / 4, cc = 4 * (e % 4);
          const int64_t i = i0 + mb * 16 + rr;
          const float* x = st_w + rr * kLdScore + cc;
          if (i < p.T)
            atomicAdd(reinterpret_cast<float4*>(dq_acc + ((b * p.T + i) * p.Hq + h) * D + nb * 16 + cc),
                      make_float4(x[0], x[1], x[2], x[3]));
        }
      }
    }
  }
  store_rows_bf16<D>(dk, dk_acc, st_w, b, k0 + warp * 16, kvh, p.Hkv, p.T);
  store_rows_bf16<D>(dv, dv_acc, st_w, b, k0 + warp * 16, kvh, p.Hkv, p.T);
}

__global__ void round_to_bf16_kernel(bf16* y, const float* x, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = __float2bfloat16_rn(x[i]);
}

const char* const kOp = "cuda flash_attention_tc";

Params params(const AttentionShape& s, const int32_t* doc_ids, DocumentBounds bounds) {
  check(s.B > 0 && s.T > 0 && s.Hq > 0 && s.Hkv > 0, kOp, "sizes must be positive");
  check(s.D == 64 || s.D == 128, kOp,
        "head_dim " + std::to_string(s.D) + " is not supported (64 or 128; kernels/cuda/attention.h takes any)");
  check(s.Hq % s.Hkv == 0, kOp,
        "query heads (" + std::to_string(s.Hq) + ") must be a multiple of kv heads (" + std::to_string(s.Hkv) + ")");
  check(s.sliding_window >= 0 && s.softcap >= 0.0f, kOp, "sliding_window and softcap must be >= 0");
  check(s.B * s.Hq < 65536, kOp, "B * heads must be < 65536 (grid y)");
  check((bounds.first_key == nullptr) == (bounds.last_query == nullptr), kOp,
        "DocumentBounds needs both first_key and last_query, or neither");
  check(bounds.first_key == nullptr || doc_ids != nullptr, kOp, "DocumentBounds without doc ids");
  return Params{s.B, s.T, s.Hq, s.Hkv, s.sliding_window, s.scale, s.softcap, doc_ids, bounds.first_key,
                bounds.last_query};
}

void check_aligned(const void* ptr, const char* name) {
  check(reinterpret_cast<uintptr_t>(ptr) % 16 == 0, kOp, std::string(name) + " must be 16-byte aligned");
}

template <typename K>
void set_shared(K kernel, size_t bytes) {
  KTUNE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

template <int D>
void forward(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, const Params& p, Stream stream) {
  constexpr size_t shared = ForwardLayout<D>::bytes;
  set_shared(forward_kernel<D>, shared);
  dim3 grid(unsigned((p.T + kTile - 1) / kTile), unsigned(p.B * p.Hq));
  forward_kernel<D><<<grid, kForwardWarps * 32, shared, stream>>>(out, lse, q, k, v, p);
  KTUNE_CUDA_CHECK_LAUNCH();
}

template <int D, int W>
void backward(bf16* dk, bf16* dv, float* dq_acc, const bf16* dout, const bf16* q, const bf16* k, const bf16* v,
              const float* lse, const float* delta, const Params& p, Stream stream) {
  constexpr size_t shared = BackwardLayout<D, W>::bytes;
  set_shared(backward_kernel<D, W>, shared);
  dim3 grid(unsigned((p.T + 16 * W - 1) / (16 * W)), unsigned(p.B * p.Hkv));
  backward_kernel<D, W><<<grid, W * 32, shared, stream>>>(dk, dv, dq_acc, dout, q, k, v, lse, delta, p);
  KTUNE_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool flash_attention_tc_supports(const AttentionShape& s) {
  return (s.D == 64 || s.D == 128) && s.Hkv > 0 && s.Hq % s.Hkv == 0 && s.sliding_window >= 0 && s.softcap >= 0.0f;
}

int64_t flash_attention_tc_backward_scratch_floats(const AttentionShape& s) {
  return s.B * s.T * s.Hq * s.D + s.B * s.Hq * s.T;
}

void flash_attention_tc_forward(bf16_t* out, float* lse, const bf16_t* q, const bf16_t* k, const bf16_t* v,
                                const AttentionShape& s, Stream stream, const int32_t* doc_ids,
                                DocumentBounds bounds) {
  const Params p = params(s, doc_ids, bounds);
  check_aligned(q, "q"), check_aligned(k, "k"), check_aligned(v, "v");
  if (s.D == 64) forward<64>(dev(out), lse, dev(q), dev(k), dev(v), p, stream);
  else forward<128>(dev(out), lse, dev(q), dev(k), dev(v), p, stream);
}

void flash_attention_tc_backward(bf16_t* dq, bf16_t* dk, bf16_t* dv, const bf16_t* dout, const bf16_t* q,
                                 const bf16_t* k, const bf16_t* v, const bf16_t* out, const float* lse,
                                 const AttentionShape& s, float* scratch, Stream stream,
                                 const int32_t* doc_ids, DocumentBounds bounds) {
  const Params p = params(s, doc_ids, bounds);
  check_aligned(dout, "dout"), check_aligned(q, "q"), check_aligned(k, "k"), check_aligned(v, "v");
  check_aligned(scratch, "scratch");
  const int64_t rows = s.B * s.T * s.Hq, nq = rows * s.D;
  float* dq_acc = scratch;       // (B, T, Hq, D) f32, first: its float4 atomics need 16-byte alignment
  float* delta = scratch + nq;   // (B, Hq, T)
  KTUNE_CUDA_CHECK(cudaMemsetAsync(dq_acc, 0, size_t(nq) * sizeof(float), stream));
  delta_kernel<<<blocks_for(rows * 32, 256), 256, 0, stream>>>(delta, dev(dout), dev(out), rows, s.T, s.Hq, s.D);
  KTUNE_CUDA_CHECK_LAUNCH();
  if (s.D == 64)
    backward<64, kBackwardWarps64>(dev(dk), dev(dv), dq_acc, dev(dout), dev(q), dev(k), dev(v), lse, delta, p, stream);
  else
    backward<128, kBackwardWarps128>(dev(dk), dev(dv), dq_acc, dev(dout), dev(q), dev(k), dev(v), lse, delta, p,
                                     stream);
  round_to_bf16_kernel<<<blocks_for(nq, 256), 256, 0, stream>>>(dev(dq), dq_acc, nq);
  KTUNE_CUDA_CHECK_LAUNCH();
}

}  // namespace ktune::cuda
