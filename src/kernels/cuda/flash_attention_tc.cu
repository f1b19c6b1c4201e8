// Fused causal attention on the tensor cores (see flash_attention_tc.h).
//
// Both directions keep their score tiles in registers (FlashAttention-2's scheme on mma.sync
// m16n8k16, whose fragment layout PTX fixes: mma_m16n8k16.cuh): accumulators are masked, soft-capped
// and exponentiated where they are, and an accumulator tile's (g, 2t..2t+1) pairs, rounded to bf16,
// are the A fragment of the next product (P V forward; P^T dO and dS^T Q backward), so no score tile
// goes through shared memory, except dS^T once backward (dQ = dS K needs it across the warps).
// Tiles of K, V (forward) and Q, dO (backward) come in by cp.async two stages deep (the next tile's
// copies land while the current one computes) and are read as fragments by ldmatrix, transposed
// where the product wants them by column.
//
// Forward, block (query tile qt, b * Hq + h), 4 warps, R row blocks of 64 queries (R = 2 at D = 64,
// 1 at D = 128: ForwardLayout); warp w owns query rows q0 + 64rb + 16w .. + 15 of each row block rb,
// and lane 4g + t the rows g and g + 8 of those, columns 2t, 2t + 1 of every 8. Each K and V fragment
// a warp reads serves its R row blocks.
//   for each key tile k0 = k_begin, .. + 64, .. up to the block's last query, and each row block whose
//   tiles these are (from the tile of its first query's first key in the window, r0 - window + 1, and
//   of its smallest first_key with DocumentBounds, whichever is later, else 0; up to the diagonal tile
//   of the warp's rows: later ones are skipped):
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
//   (Q, dO, lse and delta of the next (head, tile) pair load while this one computes), 32 queries at a time:
//     S^T = K_w Q^T, dP^T = V_w dO^T   (16 x 32 each, accumulators in registers)
//     s' = cap(scale S^T), P^T = exp(s' - lse_i), dS^T = P^T (dP^T - delta_i) (1 - (s'/cap)^2) scale
//                                      (the cap's factor only with a cap; masked, window and doc ids
//                                       too: 0), in place; dS^T also to shared memory as bf16
//     dV_w += P^T dO, dK_w += dS^T Q   (accumulators in registers, over all heads and tiles)
//   then, block-wide, dQ (64 x D) += dS K (warp w: rows 16 (w % 4) .., D / (W / 4) of the columns,
//   added with float2 atomics into f32 scratch)
// delta = rowsum(dout * out) comes first (its own kernel), dq is rounded to bf16 last.
// Skipping by DocumentBounds or the window is exact: a fully masked tile leaves the forward's m = -inf,
// l = 0 and O = 0 as they were (the tiles skipped all come before any visible key), and adds only zeros to
// dK, dV and dQ (P = dS = 0), so out, lse, dk, dv are the same bit for bit (dq too, up to the order
// of its atomics). A skipped tile's NaN or Inf (rows of other documents) no longer reaches the results,
// as a masked one's does (P = 0 times NaN V is NaN).
#include "kernels/cuda/flash_attention_tc.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <string>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/mma_m16n8k16.cuh"
#include "kernels/cuda/document_bounds.cuh"

namespace ktune::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kTile = 64;  // keys per forward tile, queries per backward tile, and a forward row block
constexpr int kForwardWarps = kTile / 16;

constexpr size_t align128(size_t n) { return (n + 127) / 128 * 128; }

// Byte offsets into the forward block's dynamic shared memory: Q, then K and V in two stages each
// (the next key tile's cp.async copies land in one while the warps compute on the other). Row
// strides of D + 8 bf16 keep every row 16-byte aligned (ldmatrix, cp.async) and put the 8 rows an
// ldmatrix reads at once in 8 different 4-bank groups.
// A forward block takes kRowBlocks blocks of 64 queries (each warp 16 rows of each), so that every K
// and V fragment a warp reads from shared memory serves 16 kRowBlocks rows: 2 at D = 64 (Q, O and S
// of 32 rows fit in registers; shared memory would otherwise bound the products: a 64-key tile's 16
// ldmatrix reads of K and 16 of V a warp against its 64 mma.sync for 16 rows), 1 at D = 128.
template <int D>
struct ForwardLayout {
  static constexpr int kRowBlocks = D == 64 ? 2 : 1;
  static constexpr int kQueries = kTile * kRowBlocks;  // queries a block
  static constexpr int kLd = D + 8;
  static constexpr size_t tile = align128(size_t(kTile) * kLd * 2);  // (64, D+8) bf16
  static constexpr size_t q = 0;                             // (kQueries, D+8)
  static constexpr size_t k = q + kRowBlocks * tile;         // 2 stages
  static constexpr size_t v = k + 2 * tile;                  // 2 stages
  static constexpr size_t bytes = v + 2 * tile;
};

// The backward block's shared memory: its K and V rows (loaded once), Q and dO tiles with their lse
// and delta in two stages (the next (head, query tile) pair's copies land while this one computes),
// and dS^T of the whole block (bf16, for dQ = dS K). Row strides as the forward's.
template <int D, int W>
struct BackwardLayout {
  static constexpr int kLd = D + 8, kKeys = 16 * W, kLdDs = kTile + 8;
  static constexpr size_t rows_tile = align128(size_t(kTile) * kLd * 2);       // (64, D+8) bf16
  static constexpr size_t k = 0;                                               // (16W, D+8) bf16
  static constexpr size_t v = k + align128(size_t(kKeys) * kLd * 2);           // (16W, D+8) bf16
  static constexpr size_t q = v + align128(size_t(kKeys) * kLd * 2);           // 2 stages of (64, D+8)
  static constexpr size_t dout = q + 2 * rows_tile;                            // 2 stages of (64, D+8)
  static constexpr size_t lse = dout + 2 * rows_tile;                          // 2 stages of (64) f32
  static constexpr size_t delta = lse + 2 * align128(kTile * 4);               // 2 stages of (64) f32
  static constexpr size_t dst = delta + 2 * align128(kTile * 4);               // (16W, 72) bf16 dS^T
  static constexpr size_t bytes = dst + align128(size_t(kKeys) * kLdDs * 2);
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

// Token i's document in batch row b: doc[b, i], or 0 past T or without doc ids.
__device__ __forceinline__ int32_t document_of(const Params& p, int64_t b, int64_t i) {
  return p.doc && i < p.T ? p.doc[b * p.T + i] : 0;
}

// Key j is visible to query i: causal, a real key (j < T), inside the window, and, with doc ids, in
// i's document (doc_i, doc_j: their document_of).
__device__ __forceinline__ bool visible(const Params& p, int64_t i, int64_t j, int32_t doc_i, int32_t doc_j) {
  return j <= i && j < p.T && (p.window == 0 || i - p.window < j) && (!p.doc || doc_i == doc_j);
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

// One warp's 16 query rows (first_row ..) against one staged 64-key tile (keys k0 ..): S = Q K^T, the
// mask and cap, the online softmax and O += P V, all in registers. o (16 x D), m, l (the lane's two
// rows g, g + 8), qf: the rows' A fragments; rows, doc_i: the two rows and their documents.
template <int D>
__device__ __forceinline__ void attend_to_tile(float (&o)[D / 8][4], float* m, float* l, const uint32_t (&qf)[D / 16][4],
                                               const bf16* ks, const bf16* vs, int64_t k0, int64_t first_row,
                                               const int64_t* rows, const int32_t* doc_i, int64_t b,
                                               const Params& p) {
  constexpr int kLd = D + 8, kScoreTiles = kTile / 8, kOutTiles = D / 8;
  const int t = threadIdx.x & 3;
  // S (16 x 64) = Q_w K^T: score tile n holds keys k0 + 8n .. + 7
  float s[kScoreTiles][4];
#pragma unroll
  for (int n = 0; n < kScoreTiles; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
  for (int np = 0; np < kScoreTiles / 2; ++np)
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)  // K^T's (dims kk*16 .., keys 16np ..) block: K's rows by column
      frag::mma_b_columns(s[2 * np], s[2 * np + 1], qf[kk], ks + np * 16 * kLd + kk * 16, kLd);
  // cap(scale S), -inf where the key is not visible. Only the diagonal tiles, the last one and (with a
  // window) those reaching back past a row's window hold keys a row must not see, and every tile with
  // doc ids: the others skip the mask. The last row sees key k0 iff k0 > that row - window.
  const bool masked = p.doc != nullptr || k0 + kTile - 1 > first_row || k0 + kTile > p.T ||
                      (p.window > 0 && k0 <= first_row + 15 - p.window);  // uniform over the warp
  float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int n = 0; n < kScoreTiles; ++n) {
    const int64_t j0 = k0 + 8 * n + 2 * t;  // this lane's two keys, their documents read once for both rows
    const int32_t doc_j[2] = {document_of(p, b, j0), document_of(p, b, j0 + 1)};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e >> 1;
      float tanh_unused;
      s[n][e] = (!masked || visible(p, rows[r], j0 + (e & 1), doc_i[r], doc_j[e & 1]))
                    ? softcap_score(s[n][e] * p.scale, p.softcap, &tanh_unused)
                    : -INFINITY;
      tile_max[r] = fmaxf(tile_max[r], s[n][e]);
    }
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
  // rounded to bf16 in registers.
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) {
    uint32_t pa[4];
    frag::a_from_accumulators(pa, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
    for (int np = 0; np < D / 16; ++np) frag::mma_b_rows(o[2 * np], o[2 * np + 1], pa, vs + kk * 16 * kLd + np * 16, kLd);
  }
}

// Blocks an SM holds: at D = 64 two (54 KiB of shared memory, Q, O and S of 32 rows a warp in
// registers), at D = 128 two (85 KiB).
template <int D>
__global__ void __launch_bounds__(kForwardWarps * 32, 2)
    forward_kernel(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, Params p) {
  using L = ForwardLayout<D>;
  constexpr int R = L::kRowBlocks, kQueries = L::kQueries;
  constexpr int kLd = L::kLd, kOutTiles = D / 8;
  constexpr size_t kStage = L::tile / 2;  // bf16 elements a stage
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* q_s = reinterpret_cast<bf16*>(smem + L::q);
  bf16* k_s = reinterpret_cast<bf16*>(smem + L::k);
  bf16* v_s = reinterpret_cast<bf16*>(smem + L::v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;  // fragment row group and column pair (mma_m16n8k16.cuh)

  const int64_t b = blockIdx.y / p.Hq, h = blockIdx.y % p.Hq, kvh = h / (p.Hq / p.Hkv);
  // The longest rows (most key tiles) first: block x = 0 takes the last query tile.
  const int64_t n_tiles = (p.T + kQueries - 1) / kQueries, q0 = (n_tiles - 1 - int64_t(blockIdx.x)) * kQueries;
  // Row block rb of this warp: rows q0 + 64 rb + 16 warp .. + 15; this lane's rows in it are its
  // fragment rows g and g + 8 (row 2 rb + r below), with their documents (rows past T are never
  // stored).
  auto first_row = [&](int rb) { return q0 + kTile * rb + 16 * warp; };
  int64_t rows[2 * R];
  int32_t doc_i[2 * R];
#pragma unroll
  for (int r = 0; r < 2 * R; ++r) {
    rows[r] = first_row(r / 2) + g + 8 * (r % 2);
    doc_i[r] = document_of(p, b, rows[r]);
  }
  const int64_t k_end = min(p.T, q0 + kQueries);  // keys past the block's last query are never visible
  // Key tiles before the window of a row block's first query, or before its first document start, are
  // never visible to it (k_from[0] <= q0: the diagonal tile runs), and it skips them: a masked tile
  // would still carry a NaN or Inf of theirs into O (P = 0 times NaN). Row blocks past T skip all.
  int64_t k_from[R], k_begin = q0;
#pragma unroll
  for (int rb = 0; rb < R; ++rb) {
    const int64_t r0 = q0 + kTile * rb;
    int64_t lo = p.window > 0 ? max(int64_t(0), r0 - p.window + 1) : 0;
    if (p.first_key && r0 < p.T) lo = max(lo, block_first_key(p.first_key, b, p.T, r0, kTile));
    k_from[rb] = r0 < p.T ? lo / kTile * kTile : p.T;
    k_begin = min(k_begin, k_from[rb]);
  }
  const int64_t key_tiles = (k_end - k_begin + kTile - 1) / kTile;

  load_tile_async<D>(q_s, q, b, q0, kQueries, h, p.Hq, p.T);
  load_tile_async<D>(k_s, k, b, k_begin, kTile, kvh, p.Hkv, p.T);
  load_tile_async<D>(v_s, v, b, k_begin, kTile, kvh, p.Hkv, p.T);
  ptx::cp_async_commit();

  uint32_t qf[R][D / 16][4];  // the warp's query rows as A fragments (loaded once Q has landed)
  float o[R][kOutTiles][4];   // O (16 x D) a row block: output tile n holds columns 8n .. 8n + 7
#pragma unroll
  for (int rb = 0; rb < R; ++rb)
#pragma unroll
    for (int n = 0; n < kOutTiles; ++n) o[rb][n][0] = o[rb][n][1] = o[rb][n][2] = o[rb][n][3] = 0.0f;
  float m[2 * R], l[2 * R];  // row maxima (the same in the 4 lanes of a row), this lane's part of the sums
#pragma unroll
  for (int r = 0; r < 2 * R; ++r) m[r] = -INFINITY, l[r] = 0.0f;

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
      for (int rb = 0; rb < R; ++rb)
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
          frag::load_a(qf[rb][kk], q_s + (kTile * rb + 16 * warp) * kLd + kk * 16, kLd);
    }
    const bf16* ks = k_s + stage;
    const bf16* vs = v_s + stage;
#pragma unroll
    for (int rb = 0; rb < R; ++rb) {
      // Before the row block's first tile, or wholly after the warp's rows of it (the later row block's
      // diagonal tile): none of the tile's keys is visible, and a fully masked tile adds nothing.
      if (k0 < k_from[rb] || k0 > first_row(rb) + 15) continue;  // uniform over the warp
      attend_to_tile<D>(o[rb], m + 2 * rb, l + 2 * rb, qf[rb], ks, vs, k0, first_row(rb), rows + 2 * rb, doc_i + 2 * rb,
                        b, p);
    }
    __syncthreads();  // every warp is done with this stage before the next tile's copies refill it
  }
  // out = O / l, lse = m + log l: l summed over the row's 4 lanes; two bf16 a lane and row at a time.
#pragma unroll
  for (int r = 0; r < 2 * R; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    const int64_t i = rows[r];
    if (i >= p.T) continue;
    if (t == 0) lse[(b * p.Hq + h) * p.T + i] = m[r] + logf(l[r]);
    const float inv = 1.0f / l[r];
    bf16* dst = out + ((b * p.T + i) * p.Hq + h) * D + 2 * t;
    const float(&orow)[kOutTiles][4] = o[r / 2];
    const int e = 2 * (r % 2);  // the row's two accumulator elements
#pragma unroll
    for (int n = 0; n < kOutTiles; ++n)
      *reinterpret_cast<uint32_t*>(dst + 8 * n) = ptx::pack_bf16x2(orow[n][e] * inv, orow[n][e + 1] * inv);
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

// Backward: a block per (key block of 16W keys, b * Hkv + kvh); see the file comment. Queries go in
// chunks of 32 (S^T and dP^T: 2 x 4 accumulator tiles a warp), so that dK and dV's accumulators
// (2 x D/8 tiles) fit beside them at D = 128.
template <int D, int W>
__global__ void __launch_bounds__(W * 32)
    backward_kernel(bf16* dk, bf16* dv, float* dq_acc, const bf16* dout, const bf16* q, const bf16* k, const bf16* v,
                    const float* lse, const float* delta, Params p) {
  using L = BackwardLayout<D, W>;
  constexpr int kLd = L::kLd, kKeys = L::kKeys, kLdDs = L::kLdDs, kOutTiles = D / 8;
  constexpr int kChunk = 32, kChunkTiles = kChunk / 8;
  constexpr size_t kRowsStage = L::rows_tile / 2;  // bf16 elements a Q / dO stage
  // dQ (64 x D) = dS K: warp w takes query rows 16 (w % 4) .. + 15 and D / (W / 4) of the columns
  constexpr int kDqCols = D / (W / 4), kDqTiles = kDqCols / 8;
  static_assert(W % 4 == 0 && kDqCols % 16 == 0, "dQ's split over the warps");
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* k_s = reinterpret_cast<bf16*>(smem + L::k);
  bf16* v_s = reinterpret_cast<bf16*>(smem + L::v);
  bf16* q_s = reinterpret_cast<bf16*>(smem + L::q);
  bf16* do_s = reinterpret_cast<bf16*>(smem + L::dout);
  float* lse_s = reinterpret_cast<float*>(smem + L::lse);
  float* delta_s = reinterpret_cast<float*>(smem + L::delta);
  bf16* dst_s = reinterpret_cast<bf16*>(smem + L::dst);  // (16W keys, 72): dS^T of the whole block
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;  // fragment row group and column pair (mma_m16n8k16.cuh)

  const int64_t b = blockIdx.y / p.Hkv, kvh = blockIdx.y % p.Hkv, group = p.Hq / p.Hkv;
  const int64_t k0 = int64_t(blockIdx.x) * kKeys;
  // This lane's two key rows of the warp's 16 (fragment rows g and g + 8) and their documents.
  const int64_t keys[2] = {k0 + warp * 16 + g, k0 + warp * 16 + g + 8};
  const int32_t doc_j[2] = {document_of(p, b, keys[0]), document_of(p, b, keys[1])};
  // Queries at or past the window's end for the block's last key (k0 + 16W - 1 + window), or after the
  // block's last document end, see none of its keys (i_end > k0: the first tile runs). k0 is a multiple
  // of 64: query tiles below it see none of these keys. Pairs (head of the group, query tile) in order.
  int64_t i_end = p.window > 0 ? min(p.T, k0 + kKeys - 1 + p.window) : p.T;
  if (p.last_query) i_end = min(i_end, block_last_query(p.last_query, b, p.T, k0, kKeys) + 1);
  const int64_t query_tiles = (i_end - k0 + kTile - 1) / kTile, pairs = group * query_tiles;
  auto pair_head = [&](int64_t n) { return kvh * group + n / query_tiles; };
  auto pair_first_query = [&](int64_t n) { return k0 + (n % query_tiles) * kTile; };
  // Pair n's Q and dO rows by cp.async, its lse and delta by plain loads, into stage n & 1.
  auto load_pair = [&](int64_t n) {
    const int64_t h = pair_head(n), i0 = pair_first_query(n);
    const size_t stage = size_t(n & 1);
    load_tile_async<D>(q_s + stage * kRowsStage, q, b, i0, kTile, h, p.Hq, p.T);
    load_tile_async<D>(do_s + stage * kRowsStage, dout, b, i0, kTile, h, p.Hq, p.T);
    for (int e = threadIdx.x; e < kTile; e += blockDim.x) {
      const int64_t i = i0 + e;
      lse_s[stage * kTile + e] = i < p.T ? lse[(b * p.Hq + h) * p.T + i] : 0.0f;
      delta_s[stage * kTile + e] = i < p.T ? delta[(b * p.Hq + h) * p.T + i] : 0.0f;
    }
  };
  load_tile_async<D>(k_s, k, b, k0, kKeys, kvh, p.Hkv, p.T);
  load_tile_async<D>(v_s, v, b, k0, kKeys, kvh, p.Hkv, p.T);
  load_pair(0);
  ptx::cp_async_commit();

  // The warp's K and V rows as A fragments, loaded once where registers allow (D = 64; at D = 128
  // they are reloaded from shared memory for every use instead).
  constexpr bool kHoistKv = D <= 64;
  uint32_t kw[kHoistKv ? D / 16 : 1][4], vw[kHoistKv ? D / 16 : 1][4];
  float dk_acc[kOutTiles][4], dv_acc[kOutTiles][4];  // (16 keys x D), tile n: columns 8n .. 8n + 7
#pragma unroll
  for (int n = 0; n < kOutTiles; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk_acc[n][e] = dv_acc[n][e] = 0.0f;

  for (int64_t pair = 0; pair < pairs; ++pair) {
    const int64_t h = pair_head(pair), i0 = pair_first_query(pair);
    const size_t stage = size_t(pair & 1);
    if (pair + 1 < pairs) load_pair(pair + 1);  // into the other stage (its readers passed the last barrier)
    ptx::cp_async_commit();
    ptx::cp_async_wait<1>();  // this thread's copies of this pair (and of K, V) have landed ...
    __syncthreads();          // ... and every other thread's, with the plain lse / delta stores
    if constexpr (kHoistKv) {
      if (pair == 0) {
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
          frag::load_a(kw[kk], k_s + warp * 16 * kLd + kk * 16, kLd);
          frag::load_a(vw[kk], v_s + warp * 16 * kLd + kk * 16, kLd);
        }
      }
    }
    const bf16* qs = q_s + stage * kRowsStage;
    const bf16* dos = do_s + stage * kRowsStage;
    const float* lse_t = lse_s + stage * kTile;
    const float* delta_t = delta_s + stage * kTile;
    for (int c0 = 0; c0 < kTile; c0 += kChunk) {
      // S^T = K_w Q^T and dP^T = V_w dO^T (16 keys x 32 queries): tile n holds queries c0 + 8n .. + 7
      float st[kChunkTiles][4], dpt[kChunkTiles][4];
#pragma unroll
      for (int n = 0; n < kChunkTiles; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) st[n][e] = dpt[n][e] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t ka[4], va[4];
        if constexpr (kHoistKv) {
#pragma unroll
          for (int e = 0; e < 4; ++e) ka[e] = kw[kk][e], va[e] = vw[kk][e];
        } else {
          frag::load_a(ka, k_s + warp * 16 * kLd + kk * 16, kLd);
          frag::load_a(va, v_s + warp * 16 * kLd + kk * 16, kLd);
        }
#pragma unroll
        for (int np = 0; np < kChunkTiles / 2; ++np) {  // Q^T's, dO^T's (dims kk*16 .., queries ..) blocks
          const int rows = (c0 + np * 16) * kLd + kk * 16;
          frag::mma_b_columns(st[2 * np], st[2 * np + 1], ka, qs + rows, kLd);
          frag::mma_b_columns(dpt[2 * np], dpt[2 * np + 1], va, dos + rows, kLd);
        }
      }
      // P^T = exp(cap(scale S^T) - lse_i) and dS^T = P^T (dP^T - delta_i) cap'(S) scale in place of S^T
      // and dP^T (masked entries 0); dS^T also to shared memory (bf16) for dQ.
#pragma unroll
      for (int n = 0; n < kChunkTiles; ++n) {
        const int64_t q_first = i0 + c0 + 8 * n + 2 * t;  // this lane's two queries, read once for both keys
        const int32_t doc_i[2] = {document_of(p, b, q_first), document_of(p, b, q_first + 1)};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e >> 1, c = c0 + 8 * n + 2 * t + (e & 1);
          const int64_t i = i0 + c;
          float pv = 0.0f, ds = 0.0f;
          if (i < p.T && visible(p, i, keys[r], doc_i[e & 1], doc_j[r])) {
            float th;  // the cap's tanh: ds takes its derivative 1 - th^2 (attention.cu's order)
            const float sc = softcap_score(st[n][e] * p.scale, p.softcap, &th);
            pv = __expf(sc - lse_t[c]);
            ds = pv * (dpt[n][e] - delta_t[c]);
            if (p.softcap > 0.0f) ds *= 1.0f - th * th;
            ds *= p.scale;
          }
          st[n][e] = pv, dpt[n][e] = ds;
        }
      }
#pragma unroll
      for (int n = 0; n < kChunkTiles; ++n)
#pragma unroll
        for (int r = 0; r < 2; ++r)
          *reinterpret_cast<uint32_t*>(dst_s + (warp * 16 + g + 8 * r) * kLdDs + c0 + 8 * n + 2 * t) =
              ptx::pack_bf16x2(dpt[n][2 * r], dpt[n][2 * r + 1]);
      // dV_w += P^T dO, dK_w += dS^T Q: P^T's and dS^T's tiles 2kq, 2kq + 1 (queries c0 + 16kq .. + 15)
      // are the A fragments of query step kq, rounded to bf16 in registers
#pragma unroll
      for (int kq = 0; kq < kChunkTiles / 2; ++kq) {
        uint32_t pa[4], dsa[4];
        frag::a_from_accumulators(pa, st[2 * kq], st[2 * kq + 1]);
        frag::a_from_accumulators(dsa, dpt[2 * kq], dpt[2 * kq + 1]);
#pragma unroll
        for (int np = 0; np < D / 16; ++np) {  // dO's, Q's (queries c0 + 16kq .., dims 16np ..) blocks
          const int rows = (c0 + kq * 16) * kLd + np * 16;
          frag::mma_b_rows(dv_acc[2 * np], dv_acc[2 * np + 1], pa, dos + rows, kLd);
          frag::mma_b_rows(dk_acc[2 * np], dk_acc[2 * np + 1], dsa, qs + rows, kLd);
        }
      }
    }
    __syncthreads();  // every warp's rows of dS^T are in place
    // dQ (64 x D) += dS K over the block's keys: the warp's 16 query rows and kDqCols columns; dS's A
    // fragments are dS^T's (keys, queries) tiles read transposed. Two floats an atomic (sm_90's float2).
    {
      const int mb = warp % 4, n_first = (warp / 4) * kDqCols;
      float dq[kDqTiles][4];
#pragma unroll
      for (int n = 0; n < kDqTiles; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk) {
        uint32_t dsa[4];  // dS's (queries 16mb .., keys 16kk ..) block: dS^T's rows by column
        frag::load_a_columns(dsa, dst_s + kk * 16 * kLdDs + mb * 16, kLdDs);
#pragma unroll
        for (int np = 0; np < kDqTiles / 2; ++np)  // K's (keys 16kk .., dims n_first + 16np ..) block
          frag::mma_b_rows(dq[2 * np], dq[2 * np + 1], dsa, k_s + kk * 16 * kLd + n_first + np * 16, kLd);
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int64_t i = i0 + mb * 16 + g + 8 * r;
        if (i >= p.T) continue;
        float* row = dq_acc + ((b * p.T + i) * p.Hq + h) * D + n_first + 2 * t;
#pragma unroll
        for (int n = 0; n < kDqTiles; ++n)
          atomicAdd(reinterpret_cast<float2*>(row + 8 * n), make_float2(dq[n][2 * r], dq[n][2 * r + 1]));
      }
    }
    // (no barrier here: the next pair refills the other stage's Q / dO / lse / delta, last read before
    // the barrier above, and writes dS^T only after its own first barrier, which every warp reaches
    // once done with this dQ)
  }
  // dK, dV rows of the warp's keys (those < T) as bf16, two columns a lane at a time.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t j = keys[r];
    if (j >= p.T) continue;
    bf16* dk_row = dk + ((b * p.T + j) * p.Hkv + kvh) * D + 2 * t;
    bf16* dv_row = dv + ((b * p.T + j) * p.Hkv + kvh) * D + 2 * t;
#pragma unroll
    for (int n = 0; n < kOutTiles; ++n) {
      *reinterpret_cast<uint32_t*>(dk_row + 8 * n) = ptx::pack_bf16x2(dk_acc[n][2 * r], dk_acc[n][2 * r + 1]);
      *reinterpret_cast<uint32_t*>(dv_row + 8 * n) = ptx::pack_bf16x2(dv_acc[n][2 * r], dv_acc[n][2 * r + 1]);
    }
  }
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
  constexpr int kQueries = ForwardLayout<D>::kQueries;
  dim3 grid(unsigned((p.T + kQueries - 1) / kQueries), unsigned(p.B * p.Hq));
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
  check_aligned(dk, "dk"), check_aligned(dv, "dv"), check_aligned(scratch, "scratch");
  const int64_t rows = s.B * s.T * s.Hq, nq = rows * s.D;
  float* dq_acc = scratch;       // (B, T, Hq, D) f32, first: its float2 atomics need 8-byte alignment
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
