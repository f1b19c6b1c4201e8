// Fused causal attention on the tensor cores (see flash_attention_tc.h).
//
// The forward keeps the scores in registers (FlashAttention-2's scheme on mma.sync m16n8k16, whose
// fragment layout PTX fixes: mma_m16n8k16.cuh): S's accumulators are masked, soft-capped and turned
// into P where they are, and P's accumulator pairs are, rounded to bf16, the A fragments of P V, so
// nothing of a (16 x 64) score tile goes through shared memory. K and V tiles come in by cp.async,
// two stages deep (the next tile's copies land while the current one computes), and are read as
// fragments by ldmatrix (V transposed).
// The backward uses wmma bf16 16x16x16 fragments read from shared memory (f32 accumulators), and every
// elementwise step (mask, softmax, dS) runs on f32 tiles in shared memory that a fragment was stored
// to, so no code there depends on which lane holds which fragment element.
//
// Forward, block (query tile qt, b * Hq + h), 4 warps; warp w owns query rows q0 + 16w .. + 15, and
// lane 4g + t the rows g and g + 8 of those, columns 2t, 2t + 1 of every 8:
//   for each key tile k0 = k_begin, .. + 64, .. <= q0 (the diagonal tile last; the ones above it are
//   skipped; k_begin: the tile of the block's first query's first key in the window, q0 - window + 1,
//   and of its smallest first_key with DocumentBounds, whichever is later; else 0):
//     S (16 x 64) = Q_w K^T            (8 accumulator tiles in registers), scaled, soft-capped
//                                      (cap tanh(s / cap)), masked (j > i or j >= T, i - window >= j,
//                                      or doc[j] != doc[i]: -inf) on the diagonal and last tiles and
//                                      those reaching back past a row's window only, on every tile with
//                                      doc ids (a tile may then mask a whole row)
//     m' = max(m, rowmax S) (over the row's 4 lanes); P = exp(S - m'); l = l e^(m - m') + rowsum P
//                                      (l: each lane's part, summed over the 4 lanes at the end)
//     O = O e^(m - m') + P V           (O: D/8 accumulator tiles in registers; P rounded to bf16)
//   out = O / l, lse = m + log l.
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
#include "kernels/cuda/mma_m16n8k16.cuh"
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

// Byte offsets into the forward block's dynamic shared memory: Q, then K and V in two stages each
// (the next key tile's cp.async copies land in one while the warps compute on the other). Row
// strides of D + 8 bf16 keep every row 16-byte aligned (ldmatrix, cp.async) and put the 8 rows an
// ldmatrix reads at once in 8 different 4-bank groups.
template <int D>
struct ForwardLayout {
  static constexpr int kLd = D + 8;
  static constexpr size_t tile = align128(size_t(kTile) * kLd * 2);  // (64, D+8) bf16
  static constexpr size_t q = 0;
  static constexpr size_t k = q + tile;      // 2 stages
  static constexpr size_t v = k + 2 * tile;  // 2 stages
  static constexpr size_t bytes = v + 2 * tile;
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

// Rows first .. first+rows-1 of head h of a (B, T, H, D) bf16 tensor into dst (rows, D+8) by cp.async,
// 16 bytes a copy; rows >= T land as 0. Part of the thread's open cp.async group (the caller commits).
template <int D>
__device__ void load_tile_async(bf16* dst, const bf16* src, int64_t b, int64_t first, int rows, int64_t h, int64_t H,
                                int64_t T) {
  constexpr int kChunks = D / 8;  // 8 bf16 per copy
  for (int e = threadIdx.x; e < rows * kChunks; e += blockDim.x) {
    const int r = e / kChunks, c = e % kChunks;
    const int64_t i = first + r;
    const bool valid = i < T;
    ptx::cp_async_16(dst + r * (D + 8) + c * 8, valid ? src + ((b * T + i) * H + h) * D + c * 8 : src, valid);
  }
}

// Blocks an SM holds by shared memory (ForwardLayout: 45 KiB at D = 64, 85 KiB at D = 128); the
// register budget follows (at D = 64, four blocks leave 128 registers a thread).
template <int D>
__global__ void __launch_bounds__(kForwardWarps * 32, D == 64 ? 3 : 2)
    forward_kernel(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, Params p) {
  using L = ForwardLayout<D>;
  constexpr int kLd = L::kLd, kScoreTiles = kTile / 8, kOutTiles = D / 8;
  constexpr size_t kStage = L::tile / 2;  // bf16 elements a stage
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* q_s = reinterpret_cast<bf16*>(smem + L::q);
  bf16* k_s = reinterpret_cast<bf16*>(smem + L::k);
  bf16* v_s = reinterpret_cast<bf16*>(smem + L::v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;  // fragment row group and column pair (mma_m16n8k16.cuh)
  // ldmatrix row addresses: lane's matrix lane / 8 of four; `rows8` picks rows 8..15 for matrices 1
  // and 3 (A tiles, V), `cols8` columns 8..15 for matrices 2 and 3; K takes them the other way round.
  const int row_in = (lane & 7) + (((lane >> 3) & 1) << 3), col_in = (lane >> 4) << 3;
  const int key_in = (lane & 7) + ((lane >> 4) << 3), dim_in = ((lane >> 3) & 1) << 3;

  const int64_t b = blockIdx.y / p.Hq, h = blockIdx.y % p.Hq, kvh = h / (p.Hq / p.Hkv);
  // The longest rows (most key tiles) first: block x = 0 takes the last query tile.
  const int64_t n_tiles = (p.T + kTile - 1) / kTile, q0 = (n_tiles - 1 - int64_t(blockIdx.x)) * kTile;
  // This lane's two rows of the warp's 16 (fragment rows g and g + 8), and their documents (rows past
  // T, never stored, keep the causal mask only).
  const int64_t rows[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
  bool doc_row[2];
  int32_t doc_i[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    doc_row[r] = p.doc && rows[r] < p.T;
    doc_i[r] = doc_row[r] ? p.doc[b * p.T + rows[r]] : 0;
  }
  const int64_t k_end = min(p.T, q0 + kTile);  // keys past the tile's last query are never visible
  // Keys before the window of the block's first query, or before its first document start, are never
  // visible (k_begin <= q0: the diagonal tile runs).
  int64_t k_lo = p.window > 0 ? max(int64_t(0), q0 - p.window + 1) : 0;
  if (p.first_key) k_lo = max(k_lo, block_first_key(p.first_key, b, p.T, q0, kTile));
  const int64_t k_begin = k_lo / kTile * kTile, key_tiles = (k_end - k_begin + kTile - 1) / kTile;

  load_tile_async<D>(q_s, q, b, q0, kTile, h, p.Hq, p.T);
  load_tile_async<D>(k_s, k, b, k_begin, kTile, kvh, p.Hkv, p.T);
  load_tile_async<D>(v_s, v, b, k_begin, kTile, kvh, p.Hkv, p.T);
  ptx::cp_async_commit();

  uint32_t qf[D / 16][4];  // the warp's 16 query rows as A fragments (loaded once Q has landed)
  float o[kOutTiles][4];   // O (16 x D): output tile n holds columns 8n .. 8n + 7
#pragma unroll
  for (int n = 0; n < kOutTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY};  // row maxima (the same in the 4 lanes of a row)
  float l[2] = {0.0f, 0.0f};            // this lane's part of the rows' sums (its 2 columns of each 8)

  for (int64_t tile = 0; tile < key_tiles; ++tile) {
    const int64_t k0 = k_begin + tile * kTile;
    const size_t stage = size_t(tile & 1) * kStage;
    if (tile + 1 < key_tiles) {  // the next tile into the other stage (its last readers passed the barrier below)
      load_tile_async<D>(k_s + (kStage - stage), k, b, k0 + kTile, kTile, kvh, p.Hkv, p.T);
      load_tile_async<D>(v_s + (kStage - stage), v, b, k0 + kTile, kTile, kvh, p.Hkv, p.T);
    }
    ptx::cp_async_commit();  // (empty on the last tile: the wait below still counts one group behind)
    ptx::cp_async_wait<1>();  // this thread's copies of this tile (and Q) have landed ...
    __syncthreads();          // ... and every other thread's
    if (tile == 0) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) ptx::ldmatrix_x4(qf[kk], q_s + (warp * 16 + row_in) * kLd + kk * 16 + col_in);
    }
    const bf16* ks = k_s + stage;
    const bf16* vs = v_s + stage;
    // S (16 x 64) = Q_w K^T: score tile n holds keys k0 + 8n .. + 7
    float s[kScoreTiles][4];
#pragma unroll
    for (int n = 0; n < kScoreTiles; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int np = 0; np < kScoreTiles / 2; ++np)
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t kb[4];  // keys 16np .. +7 (dims kk*16 + 0..7, 8..15), then keys 16np + 8 .. +15
        ptx::ldmatrix_x4(kb, ks + (np * 16 + key_in) * kLd + kk * 16 + dim_in);
        ptx::mma_bf16_16816(s[2 * np], qf[kk], kb[0], kb[1]);
        ptx::mma_bf16_16816(s[2 * np + 1], qf[kk], kb[2], kb[3]);
      }
    // cap(scale S), -inf where the key is not visible. Only the diagonal tile, the last one and (with a
    // window) those reaching back past a row's window hold keys a row must not see, and every tile with
    // doc ids: the others skip the mask. The warp's last row sees key k0 iff k0 > that row - window.
    const int64_t warp_last_row = q0 + warp * 16 + 15;
    const bool masked = p.doc != nullptr || k0 + kTile - 1 > q0 + warp * 16 || k0 + kTile > p.T ||
                        (p.window > 0 && k0 <= warp_last_row - p.window);  // uniform over the warp
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < kScoreTiles; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        const int64_t i = rows[r], j = k0 + 8 * n + 2 * t + (e & 1);
        const bool visible = j <= i && j < p.T && (p.window == 0 || i - p.window < j) &&
                             (!doc_row[r] || p.doc[b * p.T + j] == doc_i[r]);
        float tanh_unused;
        s[n][e] = (!masked || visible) ? softcap_score(s[n][e] * p.scale, p.softcap, &tanh_unused) : -INFINITY;
        tile_max[r] = fmaxf(tile_max[r], s[n][e]);
      }
    // Online softmax: the rows' maxima over their 4 lanes; P = exp(S - m'), O and l rescaled by e^(m - m').
    float alpha[2], m_use[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
      const float m_new = fmaxf(m[r], tile_max[r]);
      m_use[r] = m_new == -INFINITY ? 0.0f : m_new;  // a row with nothing visible yet keeps P = 0
      alpha[r] = __expf(m[r] - m_use[r]);            // 0 while m = -inf
      m[r] = m_new;
      l[r] *= alpha[r];
    }
#pragma unroll
    for (int n = 0; n < kScoreTiles; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[n][e] = __expf(s[n][e] - m_use[e >> 1]);
        l[e >> 1] += s[n][e];
      }
#pragma unroll
    for (int n = 0; n < kOutTiles; ++n) o[n][0] *= alpha[0], o[n][1] *= alpha[0], o[n][2] *= alpha[1], o[n][3] *= alpha[1];
    // O += P V: P's score tiles 2kk, 2kk + 1 (keys 16kk .. + 15) are the A fragment of key step kk,
    // rounded to bf16 in registers (an accumulator's (g, 2t..) pairs are an A fragment's).
#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk) {
      const uint32_t pa[4] = {ptx::pack_bf16x2(s[2 * kk][0], s[2 * kk][1]), ptx::pack_bf16x2(s[2 * kk][2], s[2 * kk][3]),
                              ptx::pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              ptx::pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int np = 0; np < D / 16; ++np) {
        uint32_t vb[4];  // keys 16kk .. +7, +8 .. +15 of dims 16np .. +7, then of dims 16np + 8 .. + 15
        ptx::ldmatrix_x4_trans(vb, vs + (kk * 16 + row_in) * kLd + np * 16 + col_in);
        ptx::mma_bf16_16816(o[2 * np], pa, vb[0], vb[1]);
        ptx::mma_bf16_16816(o[2 * np + 1], pa, vb[2], vb[3]);
      }
    }
    __syncthreads();  // every warp is done with this stage before the next tile's copies refill it
  }
  // out = O / l, lse = m + log l: l summed over the row's 4 lanes; two bf16 a lane and row at a time.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    const int64_t i = rows[r];
    if (i >= p.T) continue;
    if (t == 0) lse[(b * p.Hq + h) * p.T + i] = m[r] + logf(l[r]);
    const float inv = 1.0f / l[r];
    bf16* dst = out + ((b * p.T + i) * p.Hq + h) * D + 2 * t;
#pragma unroll
    for (int n = 0; n < kOutTiles; ++n)
      *reinterpret_cast<uint32_t*>(dst + 8 * n) = ptx::pack_bf16x2(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
  }
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
  check_aligned(q, "q"), check_aligned(k, "k"), check_aligned(v, "v"), check_aligned(out, "out");
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
