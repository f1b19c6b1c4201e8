// Causal attention through cuBLASLt GEMMs and row kernels (see attention_gemm.h).
// Scratch layout (each slice 256-byte aligned): S (B,T,T) f32 | dP (B,T,T) f32 | P (B,T,T) bf16 |
// delta (B,Hq,T) f32 | dK (B,T,Hkv,D) f32 | dV (B,T,Hkv,D) f32.
// The GEMMs work on blocks of rows (attention_gemm_block_rows): the scores S, dP of query rows
// [i0, i1) are computed for key columns [k0, i1) only (k0 = max(0, i0 - window + 1) rounded down to
// a multiple of 8, 0 without a window), and dK, dV of key rows [j0, j1) sum over query rows [j0, q1)
// only (q1 = min(T, j1 + window - 1), T without one); every S and dP entry outside its row's block
// keeps whatever was in the scratch. With HostDocumentBounds each batch row has its own k0 and q1
// (attention_gemm_blocks); a block's GEMM still runs once for all B rows, over the union of the rows'
// ranges (the smallest k0, the largest q1): as many calls as without bounds (at training sizes these
// per-head GEMMs are short, so splitting them per row would trade FLOPs for launches); the keys before
// every row's k0 and the queries from every row's q1 on are in other documents than all of the
// block's queries / keys, so what they skip is masked.
// The row kernels take one block per (b, i) row of the head at hand; they apply the soft-cap to the
// scaled scores the GEMM left in S and the mask, and read S and dP only where the mask lets the key
// through (always inside the row's block: bounds no narrower than the doc ids' ensure it); they write every entry of
// the row of P and dS, masked entries (j > i, j <= i - window, or another document: doc_ids[b, j] != doc_ids[b, i]) as
// 0, so the dK, dV GEMMs may read any of them (a key block's columns of later rows) and the masked ones add nothing.
#include "kernels/cuda/attention_gemm.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"

namespace ktune::cuda {
namespace {

constexpr int kRowThreads = 256;
constexpr int64_t kMinBlockRows = 128;  // no split below 2 blocks of this many rows

size_t align256(size_t b) { return (b + 255) / 256 * 256; }

struct Scratch {
  float *S, *dP, *delta, *dk, *dv;
  bf16_t* P;
};

Scratch carve(const AttentionShape& s, void* scratch) {
  const size_t tt = size_t(s.B) * size_t(s.T) * size_t(s.T), kv = size_t(s.B * s.T * s.Hkv * s.D);
  char* p = static_cast<char*>(scratch);
  Scratch r{};
  r.S = reinterpret_cast<float*>(p), p += align256(tt * 4);
  r.dP = reinterpret_cast<float*>(p), p += align256(tt * 4);
  r.P = reinterpret_cast<bf16_t*>(p), p += align256(tt * 2);
  r.delta = reinterpret_cast<float*>(p), p += align256(size_t(s.B * s.Hq * s.T) * 4);
  r.dk = reinterpret_cast<float*>(p), p += align256(kv * 4);
  r.dv = reinterpret_cast<float*>(p);
  return r;
}

void check_shape(const AttentionShape& s) {
  check(s.B > 0 && s.T > 0 && s.Hq > 0 && s.Hkv > 0 && s.D > 0, "cuda attention_gemm", "sizes must be positive");
  check(s.Hq % s.Hkv == 0, "cuda attention_gemm",
        "Hq=" + std::to_string(s.Hq) + " is not a multiple of Hkv=" + std::to_string(s.Hkv));
  check(s.sliding_window >= 0 && s.softcap >= 0.0f, "cuda attention_gemm",
        "the sliding window and the soft-cap must be >= 0 (0: none)");
}

// What the row kernels need besides the buffers: the mask (doc ids or nullptr, the window) and the cap.
struct RowMask {
  const int32_t* doc;  // (B, T) or nullptr
  int64_t T;
  int64_t window;  // 0: none
  float softcap;   // 0: none
};

// Key j is visible to query i of batch row b: causal (j <= i), inside the window (i - window < j, as
// kernels/cpu/attention.h), and the same document when doc ids are given.
__device__ __forceinline__ bool visible(const RowMask& m, int64_t b, int64_t i, int64_t j) {
  return j <= i && (m.window <= 0 || i - m.window < j) && (!m.doc || m.doc[b * m.T + j] == m.doc[b * m.T + i]);
}

// The first key of row i the window lets through (0 without a window): the loops over visible keys
// start there instead of at 0.
__device__ __forceinline__ int64_t first_key(const RowMask& m, int64_t i) {
  return m.window > 0 && i - m.window + 1 > 0 ? i - m.window + 1 : 0;
}

// P[r, j] = exp(cap(S[r, j]) - lse) for visible j, 0 elsewhere; lse[(b*Hq + h)*T + i] = log sum exp
// cap(S[r, j]) over the visible j. One block per row r = b*T + i.
__global__ void softmax_rows_kernel(__nv_bfloat16* P, float* lse, const float* S, RowMask mask, int64_t Hq,
                                    int64_t h) {
  __shared__ float shared[32];
  const int64_t T = mask.T, r = blockIdx.x, b = r / T, i = r % T, j0 = first_key(mask, i);
  const float* srow = S + r * T;
  float m = -INFINITY;
  for (int64_t j = j0 + threadIdx.x; j <= i; j += blockDim.x)
    if (visible(mask, b, i, j)) m = fmaxf(m, softcap_score(srow[j], mask.softcap));
  m = block_max(m, shared);
  __syncthreads();
  float sum = 0.0f;
  for (int64_t j = j0 + threadIdx.x; j <= i; j += blockDim.x)
    if (visible(mask, b, i, j)) sum += __expf(softcap_score(srow[j], mask.softcap) - m);
  sum = block_sum(sum, shared);
  const float l = m + __logf(sum);
  __nv_bfloat16* prow = P + r * T;
  for (int64_t j = threadIdx.x; j < T; j += blockDim.x)
    prow[j] = __float2bfloat16_rn(visible(mask, b, i, j) ? __expf(softcap_score(srow[j], mask.softcap) - l) : 0.0f);
  if (threadIdx.x == 0) lse[(b * Hq + h) * T + i] = l;
}

// Backward: P = exp(cap(S) - lse) (bf16, for dV), and dS = P (dP - delta) cap'(S) scale written as
// bf16 into the same buffer (the P buffer is consumed by the dV GEMM first: two passes, see below).
__global__ void probabilities_kernel(__nv_bfloat16* P, const float* S, const float* lse, RowMask mask, int64_t Hq,
                                     int64_t h) {
  const int64_t T = mask.T, r = blockIdx.x, b = r / T, i = r % T;
  const float l = lse[(b * Hq + h) * T + i];
  const float* srow = S + r * T;
  __nv_bfloat16* prow = P + r * T;
  for (int64_t j = threadIdx.x; j < T; j += blockDim.x)
    prow[j] = __float2bfloat16_rn(visible(mask, b, i, j) ? __expf(softcap_score(srow[j], mask.softcap) - l) : 0.0f);
}

// dS[r, j] = P (dP - delta) (1 - (s'/softcap)^2) scale for visible j (0 elsewhere), s' = cap(S[r, j]):
// s' = softcap tanh(s / softcap) has ds'/ds = 1 - tanh^2(s / softcap); without a cap the factor is 1.
// In f32 from the recomputed S; only the result is rounded to bf16.
__global__ void score_gradient_kernel(__nv_bfloat16* dS, const float* S, const float* dP, const float* lse,
                                      const float* delta, RowMask mask, int64_t Hq, int64_t h, float scale) {
  const int64_t T = mask.T, r = blockIdx.x, b = r / T, i = r % T;
  const float l = lse[(b * Hq + h) * T + i], d = delta[(b * Hq + h) * T + i];
  const float* srow = S + r * T;
  const float* dprow = dP + r * T;
  __nv_bfloat16* row = dS + r * T;
  for (int64_t j = threadIdx.x; j < T; j += blockDim.x) {
    float g = 0.0f;
    if (visible(mask, b, i, j)) {
      const float sc = softcap_score(srow[j], mask.softcap);
      const float t = mask.softcap > 0.0f ? sc / mask.softcap : 0.0f;  // tanh(s / softcap)
      g = __expf(sc - l) * (dprow[j] - d) * (1.0f - t * t) * scale;
    }
    row[j] = __float2bfloat16_rn(g);
  }
}

// delta[(b*Hq + h)*T + i] = sum_d dout[b,i,h,d] * out[b,i,h,d]: a warp per (b, i, h).
__global__ void rowsum_kernel(float* delta, const __nv_bfloat16* dout, const __nv_bfloat16* out, int64_t B, int64_t T,
                              int64_t Hq, int64_t D) {
  const int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (w >= B * T * Hq) return;
  const int64_t h = w % Hq, bi = w / Hq, b = bi / T, i = bi % T;
  const int64_t base = w * D;  // (b, i, h) row of (B, T, Hq, D)
  float acc = 0.0f;
  for (int64_t d = lane; d < D; d += 32) acc += __bfloat162float(dout[base + d]) * __bfloat162float(out[base + d]);
  acc = warp_sum(acc);
  if (lane == 0) delta[(b * Hq + h) * T + i] = acc;
}

__global__ void to_bf16_kernel(__nv_bfloat16* y, const float* x, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = __float2bfloat16_rn(x[i]);
}

// The blocks every GEMM runs on, one strided-batched call over the B rows each: the union of the
// rows' blocks (the smallest k0, the largest q1); without bounds every row's blocks are causality's
// and the window's alone, the calls as before.
std::vector<AttentionGemmBlock> gemm_blocks(const AttentionShape& s, HostDocumentBounds bounds) {
  std::vector<AttentionGemmBlock> blocks = attention_gemm_blocks(s.T, s.sliding_window, nullptr, nullptr);
  if (bounds.first_key) {
    for (AttentionGemmBlock& u : blocks) u.k0 = u.i0, u.q1 = u.i1;  // widened to each row's below
    for (int64_t b = 0; b < s.B; ++b) {
      const std::vector<AttentionGemmBlock> row =
          attention_gemm_blocks(s.T, s.sliding_window, bounds.first_key + b * s.T, bounds.last_query + b * s.T);
      for (size_t n = 0; n < blocks.size(); ++n)
        blocks[n].k0 = std::min(blocks[n].k0, row[n].k0), blocks[n].q1 = std::max(blocks[n].q1, row[n].q1);
    }
  }
  return blocks;
}

// One strided-batched product over the B rows of the batch (A, B bf16; C f32 or bf16, `out`).
void batched(GemmContext& ctx, int64_t batch, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
             const bf16_t* A, int64_t lda, int64_t sa, const bf16_t* Bm, int64_t ldb, int64_t sb, float beta, void* C,
             int64_t ldc, int64_t sc, DType out, Stream stream) {
  GemmCall g;
  g.trans_a = ta, g.trans_b = tb, g.M = M, g.N = N, g.K = K, g.alpha = alpha, g.beta = beta;
  g.A = A, g.lda = lda, g.B = Bm, g.ldb = ldb, g.C = C, g.ldc = ldc;
  g.in = DType::BF16, g.out = out;
  g.batch = batch, g.stride_a = sa, g.stride_b = sb, g.stride_c = sc;
  ctx.run(g, stream);
}

// S[i0:i1, k0:i1] (b) = scale Q_h[i0:i1](b) K_g[k0:i1](b)^T   f32, per row block: query head h of
// group g, the forward's scores and the backward's again.
void scores(GemmContext& ctx, float* S, const bf16_t* q, const bf16_t* k, const AttentionShape& s,
            const std::vector<AttentionGemmBlock>& blocks, int64_t h, int64_t g, Stream stream) {
  const int64_t T = s.T, D = s.D, QD = s.Hq * s.D, KD = s.Hkv * s.D;
  for (const AttentionGemmBlock& r : blocks)
    batched(ctx, s.B, false, true, r.rows(), r.keys(), D, s.scale, q + r.i0 * QD + h * D, QD, T * QD,
            k + r.k0 * KD + g * D, KD, T * KD, 0.0f, S + r.i0 * T + r.k0, T, T * T, DType::F32, stream);
}

void check_bounds(const int32_t* doc_ids, HostDocumentBounds bounds) {
  check((bounds.first_key == nullptr) == (bounds.last_query == nullptr), "cuda attention_gemm",
        "document bounds need both first_key and last_query");
  check(!bounds.first_key || doc_ids, "cuda attention_gemm", "document bounds need the doc ids they bound");
}

}  // namespace

std::vector<AttentionGemmBlock> attention_gemm_blocks(int64_t T, int64_t window, const int32_t* first_key,
                                                      const int32_t* last_query) {
  const int64_t n = attention_gemm_block_rows(T);
  std::vector<AttentionGemmBlock> blocks;
  for (int64_t i0 = 0; i0 < T; i0 += n) {
    const int64_t i1 = std::min(T, i0 + n);
    int64_t k0 = window > 0 ? std::max<int64_t>(0, i0 - window + 1) : 0;
    int64_t q1 = window > 0 ? std::min(T, i1 + window - 1) : T;
    if (first_key) {
      // clipped to [.., i0] and [i1, ..] (a token's own document holds it); the documents' q1 rounded up
      // to a multiple of 8 as k0 is down, so that packed steps bring fewer GEMM shapes (plans) to cache
      k0 = std::max<int64_t>(k0, std::min<int64_t>(i0, *std::min_element(first_key + i0, first_key + i1)));
      const int64_t last = std::max<int64_t>(i1, *std::max_element(last_query + i0, last_query + i1) + 1);
      q1 = std::min(q1, std::min(T, (last + 7) / 8 * 8));
    }
    blocks.push_back(AttentionGemmBlock{i0, i1, k0 / 8 * 8, q1});  // k0: the pointers 16-byte aligned as the rows
  }
  return blocks;
}

int64_t attention_gemm_block_rows(int64_t T) {
  const int64_t quarter = (T + 3) / 4, rounded = (quarter + 63) / 64 * 64;
  return T <= kMinBlockRows ? T : std::max(kMinBlockRows, rounded);
}

size_t attention_gemm_scratch_bytes(const AttentionShape& s) {
  const size_t tt = size_t(s.B) * size_t(s.T) * size_t(s.T), kv = size_t(s.B * s.T * s.Hkv * s.D);
  return align256(tt * 4) * 2 + align256(tt * 2) + align256(size_t(s.B * s.Hq * s.T) * 4) + align256(kv * 4) * 2;
}

void attention_gemm_forward(GemmContext& ctx, bf16_t* out, float* lse, const bf16_t* q, const bf16_t* k,
                            const bf16_t* v, const AttentionShape& s, void* scratch, Stream stream,
                            const int32_t* doc_ids, HostDocumentBounds bounds) {
  check_shape(s);
  check_bounds(doc_ids, bounds);
  const Scratch w = carve(s, scratch);
  const int64_t T = s.T, D = s.D, QD = s.Hq * s.D, KD = s.Hkv * s.D, group = s.Hq / s.Hkv;
  const RowMask mask{doc_ids, T, s.sliding_window, s.softcap};
  const std::vector<AttentionGemmBlock> blocks = gemm_blocks(s, bounds);
  for (int64_t h = 0; h < s.Hq; ++h) {
    const int64_t g = h / group;
    scores(ctx, w.S, q, k, s, blocks, h, g, stream);
    softmax_rows_kernel<<<unsigned(s.B * T), kRowThreads, 0, stream>>>(dev(w.P), lse, w.S, mask, s.Hq, h);
    KTUNE_CUDA_CHECK_LAUNCH();
    // O_h[i0:i1](b) = P[i0:i1, k0:i1](b) V_g[k0:i1](b)   bf16 into the strided head columns
    for (const AttentionGemmBlock& r : blocks)
      batched(ctx, s.B, false, false, r.rows(), D, r.keys(), 1.0f, w.P + r.i0 * T + r.k0, T, T * T,
              v + r.k0 * KD + g * D, KD, T * KD, 0.0f, out + r.i0 * QD + h * D, QD, T * QD, DType::BF16, stream);
  }
}

void attention_gemm_backward(GemmContext& ctx, bf16_t* dq, bf16_t* dk, bf16_t* dv, const bf16_t* dout,
                             const bf16_t* q, const bf16_t* k, const bf16_t* v, const bf16_t* out, const float* lse,
                             const AttentionShape& s, void* scratch, Stream stream, const int32_t* doc_ids,
                             HostDocumentBounds bounds) {
  check_shape(s);
  check_bounds(doc_ids, bounds);
  const Scratch w = carve(s, scratch);
  const int64_t T = s.T, D = s.D, QD = s.Hq * s.D, KD = s.Hkv * s.D, group = s.Hq / s.Hkv;
  const RowMask mask{doc_ids, T, s.sliding_window, s.softcap};
  const std::vector<AttentionGemmBlock> blocks = gemm_blocks(s, bounds);
  const int64_t kv = s.B * T * KD;
  KTUNE_CUDA_CHECK(cudaMemsetAsync(w.dk, 0, size_t(kv) * 4, stream));
  KTUNE_CUDA_CHECK(cudaMemsetAsync(w.dv, 0, size_t(kv) * 4, stream));
  const int64_t rows = s.B * T * s.Hq;
  rowsum_kernel<<<blocks_for(rows * 32, 256), 256, 0, stream>>>(w.delta, dev(dout), dev(out), s.B, T, s.Hq, D);
  KTUNE_CUDA_CHECK_LAUNCH();
  for (int64_t h = 0; h < s.Hq; ++h) {
    const int64_t g = h / group;
    // S = scale Q K^T again over the row blocks, P = exp(cap(S) - lse) over whole rows
    scores(ctx, w.S, q, k, s, blocks, h, g, stream);
    probabilities_kernel<<<unsigned(s.B * T), kRowThreads, 0, stream>>>(dev(w.P), w.S, lse, mask, s.Hq, h);
    KTUNE_CUDA_CHECK_LAUNCH();
    // dV_g[j0:j1] += P[j0:q1, j0:j1]^T dO_h[j0:q1]   f32, per key block: every query that sees a key of
    // the block, in one product, so each key gets one beta = 1 addition per head as with the full square
    // (the rows above j0 and from q1 on only hold zeros in these columns)
    for (const AttentionGemmBlock& c : blocks)
      batched(ctx, s.B, true, false, c.rows(), D, c.queries(), 1.0f, w.P + c.i0 * T + c.i0, T, T * T,
              dout + c.i0 * QD + h * D, QD, T * QD, 1.0f, w.dv + c.i0 * KD + g * D, KD, T * KD, DType::F32, stream);
    // dP[i0:i1, k0:i1] = dO_h[i0:i1] V_g[k0:i1]^T   f32, per row block
    for (const AttentionGemmBlock& r : blocks)
      batched(ctx, s.B, false, true, r.rows(), r.keys(), D, 1.0f, dout + r.i0 * QD + h * D, QD, T * QD,
              v + r.k0 * KD + g * D, KD, T * KD, 0.0f, w.dP + r.i0 * T + r.k0, T, T * T, DType::F32, stream);
    // dS = P (dP - delta) cap'(S) scale   (T, T) bf16 over whole rows, over P (its dV use is queued before this)
    score_gradient_kernel<<<unsigned(s.B * T), kRowThreads, 0, stream>>>(dev(w.P), w.S, w.dP, lse, w.delta, mask, s.Hq,
                                                                         h, s.scale);
    KTUNE_CUDA_CHECK_LAUNCH();
    // dQ_h[i0:i1] = dS[i0:i1, k0:i1] K_g[k0:i1]   bf16, per row block
    for (const AttentionGemmBlock& r : blocks)
      batched(ctx, s.B, false, false, r.rows(), D, r.keys(), 1.0f, w.P + r.i0 * T + r.k0, T, T * T,
              k + r.k0 * KD + g * D, KD, T * KD, 0.0f, dq + r.i0 * QD + h * D, QD, T * QD, DType::BF16, stream);
    // dK_g[j0:j1] += dS[j0:q1, j0:j1]^T Q_h[j0:q1]   f32, per key block
    for (const AttentionGemmBlock& c : blocks)
      batched(ctx, s.B, true, false, c.rows(), D, c.queries(), 1.0f, w.P + c.i0 * T + c.i0, T, T * T,
              q + c.i0 * QD + h * D, QD, T * QD, 1.0f, w.dk + c.i0 * KD + g * D, KD, T * KD, DType::F32, stream);
  }
  to_bf16_kernel<<<blocks_for(kv, 256), 256, 0, stream>>>(dev(dk), w.dk, kv);
  KTUNE_CUDA_CHECK_LAUNCH();
  to_bf16_kernel<<<blocks_for(kv, 256), 256, 0, stream>>>(dev(dv), w.dv, kv);
  KTUNE_CUDA_CHECK_LAUNCH();
}

}  // namespace ktune::cuda
