// Tiled causal attention on the CUDA cores (see attention.h).
//
// Forward: a block of kRows warps takes kRows consecutive query rows of one (b, h); warp w owns
// row q0 + w. Keys are walked in tiles of 32 held in shared memory (f32, K rows padded to D+1 floats
// so that 32 lanes reading 32 different rows hit 32 banks); lane l scores key k0 + l against the
// warp's query, the warp updates its running max m and sum l (online softmax), and the accumulator
// (lane l holds d = l, l+32, ...) adds sum_j p_j v_j with p_j broadcast by shuffle.
// Backward: delta_i = rowsum(dout_i * out_i); dq with the same walk over key tiles,
//   p = exp(cap(s) - lse_i), dp = dout_i . v_j, ds = p (dp - delta_i) cap'(.) scale, dq_i += ds k_j;
// dk, dv with a warp per key row j walking tiles of 32 queries of every query head of j's group:
//   dv_j += p dout_i, dk_j += ds q_i. No atomics: each output row has one owner (deterministic).
// Visibility of key j to query i: j <= i; i - window < j (window > 0); doc[i] == doc[j] (doc_ids).
// With DocumentBounds the walks start at the key tile of the block's smallest first_key (forward, dq)
// and end with the query tile of its keys' largest last_query (dk, dv), intersected with the window's
// range. The tiles left out would have masked every entry: a fully masked tile changes nothing (the
// forward skips a tile whose scores are all -inf while nothing is visible yet; dq, dk, dv add no term
// whose p and ds are 0), so the results are the same bit for bit.
#include "kernels/cuda/attention.h"

#include <string>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/document_bounds.cuh"

namespace ktune::cuda {
namespace {

constexpr int kRows = 8;     // warps (query rows, or key rows in dk/dv) per block
constexpr int kTile = 32;    // keys (or queries) per shared-memory tile: one per lane
constexpr int kMaxSlices = 8;  // D <= 256: each lane holds D/32 accumulator values

struct Params {
  int64_t B, T, Hq, Hkv, D, window;
  float scale, softcap;
  const int32_t* doc;
  const int32_t* first_key;   // (B, T) DocumentBounds, or nullptr
  const int32_t* last_query;  // (B, T) DocumentBounds, or nullptr
};

// The first key tile a block of queries [q0, q0 + kRows) walks: the window's first key and the
// documents' first key (DocumentBounds), whichever is later, rounded down to a tile.
__device__ __forceinline__ int64_t first_key_tile(const Params& p, int64_t b, int64_t q0) {
  int64_t lo = p.window > 0 ? max(int64_t(0), q0 - p.window + 1) : 0;
  if (p.first_key) lo = max(lo, block_first_key(p.first_key, b, p.T, q0, kRows));
  return lo / kTile * kTile;
}

__device__ __forceinline__ bool visible(const Params& p, int64_t b, int64_t i, int64_t j) {
  if (j > i || j < 0) return false;
  if (p.window > 0 && !(i - p.window < j)) return false;
  if (p.doc && p.doc[b * p.T + i] != p.doc[b * p.T + j]) return false;
  return true;
}

// Offsets of row i, head h in a (B, T, H, D) tensor.
__device__ __forceinline__ int64_t row_offset(int64_t b, int64_t i, int64_t h, int64_t T, int64_t H, int64_t D) {
  return ((b * T + i) * H + h) * D;
}

template <typename T>
__device__ void load_rows(float* dst, int64_t stride, const T* src, int64_t b, int64_t first, int64_t count,
                          int64_t limit, int64_t h, const Params& p, int64_t H) {
  // rows first .. first+count of head h (rows >= limit read as 0) into dst (count, stride)
  for (int64_t idx = threadIdx.x; idx < count * p.D; idx += blockDim.x) {
    int64_t r = idx / p.D, d = idx % p.D, i = first + r;
    dst[r * stride + d] = i < limit ? load_f32(src, row_offset(b, i, h, p.T, H, p.D) + d) : 0.0f;
  }
}

template <typename T>
__global__ void forward_kernel(T* out, float* lse, const T* q, const T* k, const T* v, Params p) {
  extern __shared__ float smem[];
  const int64_t D = p.D, Dp = D + 1;
  float* ks = smem;                 // (kTile, D+1)
  float* vs = ks + kTile * Dp;      // (kTile, D)
  float* qs = vs + kTile * D;       // (kRows, D)
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t bh = blockIdx.y, b = bh / p.Hq, h = bh % p.Hq, kvh = h / (p.Hq / p.Hkv);
  const int64_t q0 = int64_t(blockIdx.x) * kRows, i = q0 + warp;
  const bool active = i < p.T;
  load_rows(qs, D, q, b, q0, kRows, p.T, h, p, p.Hq);
  float acc[kMaxSlices];
  for (int s = 0; s < kMaxSlices; ++s) acc[s] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  const int64_t hi = min(p.T, q0 + kRows);  // keys beyond the block's last query are never visible
  const int64_t lo = first_key_tile(p, b, q0);
  for (int64_t k0 = lo; k0 < hi; k0 += kTile) {
    __syncthreads();
    load_rows(ks, Dp, k, b, k0, kTile, p.T, kvh, p, p.Hkv);
    load_rows(vs, D, v, b, k0, kTile, p.T, kvh, p, p.Hkv);
    __syncthreads();
    if (!active) continue;
    const int64_t j = k0 + lane;
    float s = -INFINITY;
    if (j < p.T && visible(p, b, i, j)) {
      float dot = 0.0f;
      const float* qr = qs + warp * D;
      const float* kr = ks + lane * Dp;
      for (int64_t d = 0; d < D; ++d) dot += qr[d] * kr[d];
      float t;
      s = softcap_score(dot * p.scale, p.softcap, &t);
    }
    const float m_new = fmaxf(m, warp_max(s));
    if (m_new == -INFINITY) continue;  // nothing visible yet
    const float pj = s == -INFINITY ? 0.0f : expf(s - m_new);
    const float alpha = m == -INFINITY ? 0.0f : expf(m - m_new);
    l = l * alpha + warp_sum(pj);
    m = m_new;
    for (int sl = 0; sl < kMaxSlices; ++sl) acc[sl] *= alpha;
    for (int key = 0; key < kTile; ++key) {
      const float pk = __shfl_sync(0xffffffffu, pj, key);
      if (pk == 0.0f) continue;  // uniform across the warp: pk is the same value in every lane
      for (int sl = 0; sl < kMaxSlices; ++sl) {
        const int64_t d = lane + 32 * sl;
        if (d < D) acc[sl] += pk * vs[key * D + d];
      }
    }
  }
  if (!active) return;
  const float inv_l = 1.0f / l;
  for (int sl = 0; sl < kMaxSlices; ++sl) {
    const int64_t d = lane + 32 * sl;
    if (d < D) store_f32(out, row_offset(b, i, h, p.T, p.Hq, D) + d, acc[sl] * inv_l);
  }
  if (lane == 0) lse[(b * p.Hq + h) * p.T + i] = m + logf(l);
}

// delta (B, Hq, T) = rowsum(dout * out): a warp per row.
template <typename T>
__global__ void delta_kernel(float* delta, const T* dout, const T* out, Params p) {
  const int64_t row = int64_t(blockIdx.x) * kRows + (threadIdx.x >> 5);  // over (b, i, h) in storage order
  const int lane = threadIdx.x & 31;
  if (row >= p.B * p.T * p.Hq) return;
  float acc = 0.0f;
  for (int64_t d = lane; d < p.D; d += 32) acc += load_f32(dout, row * p.D + d) * load_f32(out, row * p.D + d);
  acc = warp_sum(acc);
  if (lane == 0) {
    const int64_t h = row % p.Hq, bi = row / p.Hq, b = bi / p.T, i = bi % p.T;
    delta[(b * p.Hq + h) * p.T + i] = acc;
  }
}

template <typename T>
__global__ void dq_kernel(T* dq, const T* dout, const T* q, const T* k, const T* v, const float* lse,
                          const float* delta, Params p) {
  extern __shared__ float smem[];
  const int64_t D = p.D, Dp = D + 1;
  float* ks = smem;                 // (kTile, D+1)
  float* vs = ks + kTile * Dp;      // (kTile, D+1)
  float* qs = vs + kTile * Dp;      // (kRows, D)
  float* dos = qs + kRows * D;      // (kRows, D)
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t bh = blockIdx.y, b = bh / p.Hq, h = bh % p.Hq, kvh = h / (p.Hq / p.Hkv);
  const int64_t q0 = int64_t(blockIdx.x) * kRows, i = q0 + warp;
  const bool active = i < p.T;
  load_rows(qs, D, q, b, q0, kRows, p.T, h, p, p.Hq);
  load_rows(dos, D, dout, b, q0, kRows, p.T, h, p, p.Hq);
  const float lse_i = active ? lse[(b * p.Hq + h) * p.T + i] : 0.0f;
  const float delta_i = active ? delta[(b * p.Hq + h) * p.T + i] : 0.0f;
  float acc[kMaxSlices];
  for (int s = 0; s < kMaxSlices; ++s) acc[s] = 0.0f;
  const int64_t hi = min(p.T, q0 + kRows);
  const int64_t lo = first_key_tile(p, b, q0);
  for (int64_t k0 = lo; k0 < hi; k0 += kTile) {
    __syncthreads();
    load_rows(ks, Dp, k, b, k0, kTile, p.T, kvh, p, p.Hkv);
    load_rows(vs, Dp, v, b, k0, kTile, p.T, kvh, p, p.Hkv);
    __syncthreads();
    if (!active) continue;
    const int64_t j = k0 + lane;
    float ds = 0.0f;
    if (j < p.T && visible(p, b, i, j)) {
      float dot = 0.0f, dp = 0.0f;
      const float *qr = qs + warp * D, *dor = dos + warp * D, *kr = ks + lane * Dp, *vr = vs + lane * Dp;
      for (int64_t d = 0; d < D; ++d) {
        dot += qr[d] * kr[d];
        dp += dor[d] * vr[d];
      }
      float t;
      const float sc = softcap_score(dot * p.scale, p.softcap, &t);
      const float pij = expf(sc - lse_i);
      ds = pij * (dp - delta_i);
      if (p.softcap > 0.0f) ds *= 1.0f - t * t;
      ds *= p.scale;
    }
    for (int key = 0; key < kTile; ++key) {
      const float dk = __shfl_sync(0xffffffffu, ds, key);
      if (dk == 0.0f) continue;
      for (int sl = 0; sl < kMaxSlices; ++sl) {
        const int64_t d = lane + 32 * sl;
        if (d < D) acc[sl] += dk * ks[key * Dp + d];
      }
    }
  }
  if (!active) return;
  for (int sl = 0; sl < kMaxSlices; ++sl) {
    const int64_t d = lane + 32 * sl;
    if (d < D) store_f32(dq, row_offset(b, i, h, p.T, p.Hq, D) + d, acc[sl]);
  }
}

template <typename T>
__global__ void dkdv_kernel(T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const float* lse,
                            const float* delta, Params p) {
  extern __shared__ float smem[];
  const int64_t D = p.D, Dp = D + 1;
  float* qs = smem;                  // (kTile, D+1) queries
  float* dos = qs + kTile * Dp;      // (kTile, D+1)
  float* ks = dos + kTile * Dp;      // (kRows, D) this block's keys
  float* vs = ks + kRows * D;        // (kRows, D)
  float* lses = vs + kRows * D;      // (kTile)
  float* deltas = lses + kTile;      // (kTile)
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t bh = blockIdx.y, b = bh / p.Hkv, kvh = bh % p.Hkv, group = p.Hq / p.Hkv;
  const int64_t j0 = int64_t(blockIdx.x) * kRows, j = j0 + warp;
  const bool active = j < p.T;
  load_rows(ks, D, k, b, j0, kRows, p.T, kvh, p, p.Hkv);
  load_rows(vs, D, v, b, j0, kRows, p.T, kvh, p, p.Hkv);
  float acc_k[kMaxSlices], acc_v[kMaxSlices];
  for (int s = 0; s < kMaxSlices; ++s) acc_k[s] = acc_v[s] = 0.0f;
  // Queries that can see a key of this block: i >= j0, and i < j_last + window with a window, and
  // i <= the keys' largest last_query with DocumentBounds.
  const int64_t i_lo = j0 / kTile * kTile;
  int64_t i_hi = p.window > 0 ? min(p.T, j0 + kRows - 1 + p.window) : p.T;
  if (p.last_query) i_hi = min(i_hi, block_last_query(p.last_query, b, p.T, j0, kRows) + 1);
  for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
    for (int64_t i0 = i_lo; i0 < i_hi; i0 += kTile) {
      __syncthreads();
      load_rows(qs, Dp, q, b, i0, kTile, p.T, h, p, p.Hq);
      load_rows(dos, Dp, dout, b, i0, kTile, p.T, h, p, p.Hq);
      if (threadIdx.x < kTile) {
        const int64_t i = i0 + threadIdx.x;
        lses[threadIdx.x] = i < p.T ? lse[(b * p.Hq + h) * p.T + i] : 0.0f;
        deltas[threadIdx.x] = i < p.T ? delta[(b * p.Hq + h) * p.T + i] : 0.0f;
      }
      __syncthreads();
      if (!active) continue;
      const int64_t i = i0 + lane;
      float pij = 0.0f, ds = 0.0f;
      if (i < p.T && visible(p, b, i, j)) {
        float dot = 0.0f, dp = 0.0f;
        const float *qr = qs + lane * Dp, *dor = dos + lane * Dp, *kr = ks + warp * D, *vr = vs + warp * D;
        for (int64_t d = 0; d < D; ++d) {
          dot += qr[d] * kr[d];
          dp += dor[d] * vr[d];
        }
        float t;
        const float sc = softcap_score(dot * p.scale, p.softcap, &t);
        pij = expf(sc - lses[lane]);
        ds = pij * (dp - deltas[lane]);
        if (p.softcap > 0.0f) ds *= 1.0f - t * t;
        ds *= p.scale;
      }
      for (int r = 0; r < kTile; ++r) {
        const float pr = __shfl_sync(0xffffffffu, pij, r);
        const float dsr = __shfl_sync(0xffffffffu, ds, r);
        if (pr == 0.0f && dsr == 0.0f) continue;
        for (int sl = 0; sl < kMaxSlices; ++sl) {
          const int64_t d = lane + 32 * sl;
          if (d < D) {
            acc_v[sl] += pr * dos[r * Dp + d];
            acc_k[sl] += dsr * qs[r * Dp + d];
          }
        }
      }
    }
  }
  if (!active) return;
  for (int sl = 0; sl < kMaxSlices; ++sl) {
    const int64_t d = lane + 32 * sl;
    if (d < D) {
      store_f32(dk, row_offset(b, j, kvh, p.T, p.Hkv, D) + d, acc_k[sl]);
      store_f32(dv, row_offset(b, j, kvh, p.T, p.Hkv, D) + d, acc_v[sl]);
    }
  }
}

Params params(const AttentionShape& s, const int32_t* doc_ids, DocumentBounds bounds) {
  check(s.B > 0 && s.T > 0 && s.Hq > 0 && s.Hkv > 0 && s.D > 0, "cuda attention", "sizes must be positive");
  check(s.Hq % s.Hkv == 0, "cuda attention",
        "query heads (" + std::to_string(s.Hq) + ") must be a multiple of kv heads (" + std::to_string(s.Hkv) + ")");
  check(s.D <= 32 * kMaxSlices, "cuda attention", "head_dim " + std::to_string(s.D) + " > 256 is not supported");
  check(s.sliding_window >= 0 && s.softcap >= 0, "cuda attention", "sliding_window and softcap must be >= 0");
  check(s.B * s.Hq < 65536 && s.B * s.Hkv < 65536, "cuda attention", "B * heads must be < 65536 (grid y)");
  check((bounds.first_key == nullptr) == (bounds.last_query == nullptr), "cuda attention",
        "DocumentBounds needs both first_key and last_query, or neither");
  check(bounds.first_key == nullptr || doc_ids != nullptr, "cuda attention", "DocumentBounds without doc ids");
  return Params{s.B, s.T, s.Hq, s.Hkv, s.D, s.sliding_window, s.scale, s.softcap, doc_ids, bounds.first_key,
                bounds.last_query};
}

template <typename K>
void set_shared(K kernel, size_t bytes) {
  KTUNE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

template <typename T>
void forward(T* out, float* lse, const T* q, const T* k, const T* v, const int32_t* doc_ids, DocumentBounds bounds,
             const AttentionShape& s, Stream stream) {
  const Params p = params(s, doc_ids, bounds);
  const size_t shared = size_t(kTile * (p.D + 1) + kTile * p.D + kRows * p.D) * sizeof(float);
  set_shared(forward_kernel<T>, shared);
  dim3 grid(unsigned((p.T + kRows - 1) / kRows), unsigned(p.B * p.Hq));
  forward_kernel<T><<<grid, kRows * 32, shared, stream>>>(out, lse, q, k, v, p);
  KTUNE_CUDA_CHECK_LAUNCH();
}

template <typename T>
void backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out, const float* lse,
              const int32_t* doc_ids, DocumentBounds bounds, const AttentionShape& s, float* delta, Stream stream) {
  const Params p = params(s, doc_ids, bounds);
  delta_kernel<T><<<unsigned((p.B * p.T * p.Hq + kRows - 1) / kRows), kRows * 32, 0, stream>>>(delta, dout, out, p);
  KTUNE_CUDA_CHECK_LAUNCH();
  const size_t dq_shared = size_t(2 * kTile * (p.D + 1) + 2 * kRows * p.D) * sizeof(float);
  set_shared(dq_kernel<T>, dq_shared);
  dim3 qgrid(unsigned((p.T + kRows - 1) / kRows), unsigned(p.B * p.Hq));
  dq_kernel<T><<<qgrid, kRows * 32, dq_shared, stream>>>(dq, dout, q, k, v, lse, delta, p);
  KTUNE_CUDA_CHECK_LAUNCH();
  const size_t kv_shared = size_t(2 * kTile * (p.D + 1) + 2 * kRows * p.D + 2 * kTile) * sizeof(float);
  set_shared(dkdv_kernel<T>, kv_shared);
  dim3 kgrid(unsigned((p.T + kRows - 1) / kRows), unsigned(p.B * p.Hkv));
  dkdv_kernel<T><<<kgrid, kRows * 32, kv_shared, stream>>>(dk, dv, dout, q, k, v, lse, delta, p);
  KTUNE_CUDA_CHECK_LAUNCH();
}

}  // namespace

int64_t attention_backward_scratch_floats(const AttentionShape& s) { return s.B * s.Hq * s.T; }

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v, const int32_t* doc_ids,
                       DocumentBounds bounds, const AttentionShape& s, Stream stream) {
  forward(out, lse, q, k, v, doc_ids, bounds, s, stream);
}
void attention_forward(bf16_t* out, float* lse, const bf16_t* q, const bf16_t* k, const bf16_t* v,
                       const int32_t* doc_ids, DocumentBounds bounds, const AttentionShape& s, Stream stream) {
  forward(dev(out), lse, dev(q), dev(k), dev(v), doc_ids, bounds, s, stream);
}
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                        const float* v, const float* out, const float* lse, const int32_t* doc_ids,
                        DocumentBounds bounds, const AttentionShape& s, float* scratch, Stream stream) {
  backward(dq, dk, dv, dout, q, k, v, out, lse, doc_ids, bounds, s, scratch, stream);
}
void attention_backward(bf16_t* dq, bf16_t* dk, bf16_t* dv, const bf16_t* dout, const bf16_t* q, const bf16_t* k,
                        const bf16_t* v, const bf16_t* out, const float* lse, const int32_t* doc_ids,
                        DocumentBounds bounds, const AttentionShape& s, float* scratch, Stream stream) {
  backward(dev(dq), dev(dk), dev(dv), dev(dout), dev(q), dev(k), dev(v), dev(out), lse, doc_ids, bounds, s, scratch,
           stream);
}

}  // namespace ktune::cuda
