// Tiled causal attention with an online softmax, flash-attention-2 style, on the CPU.
//
// Forward: work items are (batch, query head, query tile of kQueryTile rows), spread over the
// threads (largest first). For each item the visible key range [lo, hi) is walked in tiles of
// kKeyTile keys: S = scale Q K^T (gemm), soft-cap, mask, online softmax (running max m and sum l
// per row, the accumulator rescaled by exp(m_old - m_new)), O += P V (gemm). Finally
// out = O / l and lse = m + log l. Memory: a (kQueryTile, kKeyTile) tile per thread.
//
// Backward, per key tile of kBwdKeyTile keys of one (batch, kv head): the tile owns its dK, dV rows.
// For each query head of the group and each query tile that can see the key tile, P = exp(S - lse)
// is recomputed, then
//   dV += P^T dO;  dP = dO V^T;  dS = P (dP - rowsum(dO o O)) cap'(.) scale;  dQ += dS K;  dK += dS^T Q.
// Threads take whole (batch, kv head) pairs when they divide evenly (then each owns its dQ rows);
// otherwise they share key tiles and add dQ into per-thread buffers summed at the end.
//
// Visibility of key j to query i: j <= i; i - window < j (window > 0); doc[i] == doc[j] (doc_ids).
// Key ranges are narrowed by all three (for documents: from the first occurrence of the query's id).
#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/vector_math.h"

namespace ktune::cpu {
namespace {

constexpr int64_t kQueryTile = 64;    // forward query rows per work item
constexpr int64_t kKeyTile = 256;     // forward keys per online-softmax step
constexpr int64_t kBwdKeyTile = 64;   // backward keys per work item
constexpr int64_t kBwdQueryTile = 256;

// Threads worth starting for this problem: one for tiny ones (a parallel region costs more than they do).
int threads_for(const AttentionShape& s) {
  const double flops = double(s.B) * s.Hq * double(s.T) * double(s.T) * s.D;
  return flops < double(1 << 21) ? 1 : num_threads();
}

void check_shape(const AttentionShape& s) {
  check(s.B > 0 && s.T > 0 && s.Hq > 0 && s.Hkv > 0 && s.D > 0, "attention", "sizes must be positive");
  check(s.Hq % s.Hkv == 0, "attention",
        "query heads (" + std::to_string(s.Hq) + ") must be a multiple of kv heads (" + std::to_string(s.Hkv) + ")");
  check(s.sliding_window >= 0 && s.softcap >= 0, "attention", "sliding_window and softcap must be >= 0");
}

// first[b*T + i]: the first position of row b holding doc_ids[b, i] (keys before it are invisible to i).
std::vector<int64_t> first_occurrences(const int32_t* doc_ids, const AttentionShape& s) {
  std::vector<int64_t> first(static_cast<size_t>(s.B * s.T));
  for (int64_t b = 0; b < s.B; ++b) {
    std::unordered_map<int32_t, int64_t> seen;
    for (int64_t i = 0; i < s.T; ++i) {
      auto [it, inserted] = seen.emplace(doc_ids[b * s.T + i], i);
      first[size_t(b * s.T + i)] = it->second;
    }
  }
  return first;
}

// last[b*T + j]: the last position of row b holding doc_ids[b, j] (queries after it cannot see key j).
std::vector<int64_t> last_occurrences(const int32_t* doc_ids, const AttentionShape& s) {
  std::vector<int64_t> last(static_cast<size_t>(s.B * s.T));
  for (int64_t b = 0; b < s.B; ++b) {
    std::unordered_map<int32_t, int64_t> seen;
    for (int64_t j = s.T - 1; j >= 0; --j) {
      auto [it, inserted] = seen.emplace(doc_ids[b * s.T + j], j);
      last[size_t(b * s.T + j)] = it->second;
    }
  }
  return last;
}

// Lowest key query i can see.
inline int64_t key_lo(const AttentionShape& s, const std::vector<int64_t>& first, int64_t b, int64_t i) {
  int64_t lo = s.sliding_window > 0 ? std::max<int64_t>(0, i - s.sliding_window + 1) : 0;
  if (!first.empty()) lo = std::max(lo, first[size_t(b * s.T + i)]);
  return lo;
}

// Scores of one tile, rows [q0, q0+rows) x keys [k0, k0+cols): soft-cap in place, masked entries -inf.
// s has row stride cols.
void cap_and_mask(float* S, int64_t rows, int64_t cols, int64_t q0, int64_t k0, int64_t b, const int32_t* doc_ids,
                  const std::vector<int64_t>& first, const AttentionShape& sh) {
  const float cap = sh.softcap, inv_cap = sh.softcap > 0 ? 1.0f / sh.softcap : 0.0f;
  for (int64_t r = 0; r < rows; ++r) {
    float* s = S + r * cols;
    const int64_t i = q0 + r;
    if (cap > 0) {
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) s[c] = cap * vtanh(s[c] * inv_cap);
    }
    // visible columns: [lo - k0, i - k0]
    const int64_t c_lo = std::clamp<int64_t>(key_lo(sh, first, b, i) - k0, 0, cols);
    const int64_t c_hi = std::clamp<int64_t>(i - k0 + 1, 0, cols);
    for (int64_t c = 0; c < c_lo; ++c) s[c] = -INFINITY;
    for (int64_t c = std::max(c_hi, c_lo); c < cols; ++c) s[c] = -INFINITY;
    if (doc_ids) {
      const int32_t* doc = doc_ids + b * sh.T;
      const int32_t di = doc[i];
      for (int64_t c = c_lo; c < c_hi; ++c)
        if (doc[k0 + c] != di) s[c] = -INFINITY;
    }
  }
}

}  // namespace

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const int32_t* doc_ids, const AttentionShape& s) {
  check_shape(s);
  const int64_t T = s.T, D = s.D, group = s.Hq / s.Hkv;
  const int64_t ldq = s.Hq * D, ldk = s.Hkv * D;
  const std::vector<int64_t> first = doc_ids ? first_occurrences(doc_ids, s) : std::vector<int64_t>{};
  const int64_t q_tiles = (T + kQueryTile - 1) / kQueryTile;
  const int64_t items = s.B * s.Hq * q_tiles;
#pragma omp parallel num_threads(threads_for(s))
  {
    std::vector<float> S(static_cast<size_t>(kQueryTile * kKeyTile)), O(static_cast<size_t>(kQueryTile * D));
    std::vector<float> m(static_cast<size_t>(kQueryTile)), l(static_cast<size_t>(kQueryTile));
    // Items ordered so that the last (largest) query tiles come first.
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t qt = q_tiles - 1 - item / (s.B * s.Hq);
      const int64_t bh = item % (s.B * s.Hq), b = bh / s.Hq, h = bh % s.Hq, kvh = h / group;
      const int64_t q0 = qt * kQueryTile, rows = std::min(kQueryTile, T - q0);
      int64_t lo = T;
      for (int64_t i = q0; i < q0 + rows; ++i) lo = std::min(lo, key_lo(s, first, b, i));
      const int64_t hi = q0 + rows;
      const float* Q = q + ((b * T + q0) * s.Hq + h) * D;
      std::fill(m.begin(), m.end(), -INFINITY);
      std::fill(l.begin(), l.end(), 0.0f);
      std::fill(O.begin(), O.end(), 0.0f);
      for (int64_t k0 = lo; k0 < hi; k0 += kKeyTile) {
        const int64_t cols = std::min(kKeyTile, hi - k0);
        const float* K = k + ((b * T + k0) * s.Hkv + kvh) * D;
        const float* V = v + ((b * T + k0) * s.Hkv + kvh) * D;
        gemm_strided(false, true, rows, cols, D, s.scale, Q, ldq, K, ldk, 0.0f, S.data(), cols);
        cap_and_mask(S.data(), rows, cols, q0, k0, b, doc_ids, first, s);
        for (int64_t r = 0; r < rows; ++r) {
          float* sr = S.data() + r * cols;
          float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
          for (int64_t c = 0; c < cols; ++c) mx = std::max(mx, sr[c]);
          const float m_new = std::max(m[size_t(r)], mx);
          if (m_new == -INFINITY) {  // nothing visible yet in this row
#pragma omp simd
            for (int64_t c = 0; c < cols; ++c) sr[c] = 0.0f;
            continue;
          }
          const float alpha = vexp(m[size_t(r)] - m_new);  // 0 when m was -inf
          float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
          for (int64_t c = 0; c < cols; ++c) {
            float p = vexp(sr[c] - m_new);  // masked: exp(-inf) = 0
            sr[c] = p;
            sum += p;
          }
          l[size_t(r)] = l[size_t(r)] * alpha + sum;
          m[size_t(r)] = m_new;
          if (alpha != 1.0f) {
            float* o = O.data() + r * D;
#pragma omp simd
            for (int64_t d = 0; d < D; ++d) o[d] *= alpha;
          }
        }
        gemm_strided(false, false, rows, D, cols, 1.0f, S.data(), cols, V, ldk, 1.0f, O.data(), D);
      }
      for (int64_t r = 0; r < rows; ++r) {
        const float inv = 1.0f / l[size_t(r)];
        float* dst = out + ((b * T + q0 + r) * s.Hq + h) * D;
        const float* o = O.data() + r * D;
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) dst[d] = o[d] * inv;
        lse[(b * s.Hq + h) * T + q0 + r] = m[size_t(r)] + std::log(l[size_t(r)]);
      }
    }
  }
}

namespace {

struct BackwardContext {
  const AttentionShape& s;
  const float *dout, *q, *k, *v, *lse, *delta;
  const int32_t* doc_ids;
  const std::vector<int64_t>& first;
  const std::vector<int64_t>& last;  // doc_ids: the queries that see a key tile end at its documents' last position
  float *dk, *dv;
};

// Scratch one thread needs for key tiles.
struct BackwardScratch {
  std::vector<float> S, dP, capd, dK, dV;
  explicit BackwardScratch(int64_t D)
      : S(static_cast<size_t>(kBwdQueryTile * kBwdKeyTile)),
        dP(static_cast<size_t>(kBwdQueryTile * kBwdKeyTile)),
        capd(static_cast<size_t>(kBwdQueryTile * kBwdKeyTile)),
        dK(static_cast<size_t>(kBwdKeyTile * D)),
        dV(static_cast<size_t>(kBwdKeyTile * D)) {}
};

// Key tile kt of (b, kv head): writes its dK, dV rows; adds into dq_acc (layout (B, T, Hq, D)).
void backward_key_tile(const BackwardContext& c, BackwardScratch& w, int64_t b, int64_t kvh, int64_t kt,
                       float* dq_acc) {
  const AttentionShape& s = c.s;
  const int64_t T = s.T, D = s.D, group = s.Hq / s.Hkv;
  const int64_t ldq = s.Hq * D, ldk = s.Hkv * D;
  const float cap = s.softcap, inv_cap = s.softcap > 0 ? 1.0f / s.softcap : 0.0f;
  const int64_t k0 = kt * kBwdKeyTile, cols = std::min(kBwdKeyTile, T - k0);
  const float* K = c.k + ((b * T + k0) * s.Hkv + kvh) * D;
  const float* V = c.v + ((b * T + k0) * s.Hkv + kvh) * D;
  std::fill(w.dK.begin(), w.dK.end(), 0.0f);
  std::fill(w.dV.begin(), w.dV.end(), 0.0f);
  // queries that can see some key of the tile: [k0, q_end)
  int64_t q_end = T;
  if (s.sliding_window > 0) q_end = std::min(T, k0 + cols - 1 + s.sliding_window);
  if (!c.last.empty()) {  // packed or padding-free rows: no query past the tile's documents sees it
    int64_t doc_end = 0;
    for (int64_t j = k0; j < k0 + cols; ++j) doc_end = std::max(doc_end, c.last[size_t(b * T + j)] + 1);
    q_end = std::min(q_end, doc_end);
  }
  for (int64_t g = 0; g < group; ++g) {
    const int64_t h = kvh * group + g;
    for (int64_t q0 = k0; q0 < q_end; q0 += kBwdQueryTile) {
      const int64_t rows = std::min(kBwdQueryTile, q_end - q0);
      const float* Q = c.q + ((b * T + q0) * s.Hq + h) * D;
      const float* dO = c.dout + ((b * T + q0) * s.Hq + h) * D;
      const float* L = c.lse + (b * s.Hq + h) * T + q0;
      const float* Dl = c.delta + (b * s.Hq + h) * T + q0;
      float* S = w.S.data();
      float* dS = w.dP.data();
      gemm_strided(false, true, rows, cols, D, s.scale, Q, ldq, K, ldk, 0.0f, S, cols);
      cap_and_mask(S, rows, cols, q0, k0, b, c.doc_ids, c.first, s);
      // P = exp(S - lse) in S; cap'(.) = 1 - (S/cap)^2 kept when capping
      for (int64_t r = 0; r < rows; ++r) {
        float* sr = S + r * cols;
        const float li = L[r];
        if (cap > 0) {
          float* cr = w.capd.data() + r * cols;
#pragma omp simd
          for (int64_t j = 0; j < cols; ++j) {
            float t = sr[j] * inv_cap;
            cr[j] = sr[j] == -INFINITY ? 0.0f : 1.0f - t * t;
            sr[j] = vexp(sr[j] - li);
          }
        } else {
#pragma omp simd
          for (int64_t j = 0; j < cols; ++j) sr[j] = vexp(sr[j] - li);
        }
      }
      // dV += P^T dO
      gemm_strided(true, false, cols, D, rows, 1.0f, S, cols, dO, ldq, 1.0f, w.dV.data(), D);
      // dS = P (dO V^T - delta) cap' scale
      gemm_strided(false, true, rows, cols, D, 1.0f, dO, ldq, V, ldk, 0.0f, dS, cols);
      for (int64_t r = 0; r < rows; ++r) {
        const float* p = S + r * cols;
        float* ds = dS + r * cols;
        const float di = Dl[r];
        if (cap > 0) {
          const float* cr = w.capd.data() + r * cols;
#pragma omp simd
          for (int64_t j = 0; j < cols; ++j) ds[j] = p[j] * (ds[j] - di) * cr[j] * s.scale;
        } else {
#pragma omp simd
          for (int64_t j = 0; j < cols; ++j) ds[j] = p[j] * (ds[j] - di) * s.scale;
        }
      }
      // dQ += dS K ;  dK += dS^T Q
      gemm_strided(false, false, rows, D, cols, 1.0f, dS, cols, K, ldk, 1.0f, dq_acc + ((b * T + q0) * s.Hq + h) * D,
                   ldq);
      gemm_strided(true, false, cols, D, rows, 1.0f, dS, cols, Q, ldq, 1.0f, w.dK.data(), D);
    }
  }
  for (int64_t j = 0; j < cols; ++j) {
    std::copy(w.dK.begin() + j * D, w.dK.begin() + (j + 1) * D, c.dk + ((b * T + k0 + j) * s.Hkv + kvh) * D);
    std::copy(w.dV.begin() + j * D, w.dV.begin() + (j + 1) * D, c.dv + ((b * T + k0 + j) * s.Hkv + kvh) * D);
  }
}

}  // namespace

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                        const float* v, const float* out, const float* lse, const int32_t* doc_ids,
                        const AttentionShape& s) {
  check_shape(s);
  const int64_t T = s.T, D = s.D;
  const std::vector<int64_t> first = doc_ids ? first_occurrences(doc_ids, s) : std::vector<int64_t>{};
  const std::vector<int64_t> last = doc_ids ? last_occurrences(doc_ids, s) : std::vector<int64_t>{};
  // delta (B, Hq, T) = rowsum(dO o O)
  std::vector<float> delta(static_cast<size_t>(s.B * s.Hq * T));
  const int64_t nq = s.B * T * s.Hq * D;
  parallel_for(s.B * T, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const int64_t b = n / T, i = n % T;
      for (int64_t h = 0; h < s.Hq; ++h) {
        const float* o = out + (n * s.Hq + h) * D;
        const float* d_o = dout + (n * s.Hq + h) * D;
        float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
        for (int64_t d = 0; d < D; ++d) acc += o[d] * d_o[d];
        delta[size_t((b * s.Hq + h) * T + i)] = acc;
      }
      std::fill(dq + n * s.Hq * D, dq + (n + 1) * s.Hq * D, 0.0f);
    }
  }, 16);
  const BackwardContext ctx{s, dout, q, k, v, lse, delta.data(), doc_ids, first, last, dk, dv};
  const int threads = threads_for(s);
  const int64_t k_tiles = (T + kBwdKeyTile - 1) / kBwdKeyTile;
  const int64_t pairs = s.B * s.Hkv;
  if (pairs % threads == 0 || pairs >= 4 * threads) {
    // Each (b, kv head) is one thread's: it owns dq rows of its query heads, dk, dv rows of its kv head.
#pragma omp parallel num_threads(threads)
    {
      BackwardScratch w(D);
#pragma omp for schedule(dynamic, 1)
      for (int64_t pair = 0; pair < pairs; ++pair)
        for (int64_t kt = 0; kt < k_tiles; ++kt) backward_key_tile(ctx, w, pair / s.Hkv, pair % s.Hkv, kt, dq);
    }
    return;
  }
  // Few (b, kv head) pairs: threads share them by key tile, each adding dq into its own buffer.
  std::vector<float> dq_partial(static_cast<size_t>(threads - 1) * size_t(nq), 0.0f);
  const int64_t items = pairs * k_tiles;
#pragma omp parallel num_threads(threads)
  {
    BackwardScratch w(D);
    const int t = omp_get_thread_num();
    float* acc = t == 0 ? dq : dq_partial.data() + size_t(t - 1) * size_t(nq);
    // key tile 0 of each pair sees the most queries: largest first
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < items; ++item)
      backward_key_tile(ctx, w, (item % pairs) / s.Hkv, (item % pairs) % s.Hkv, item / pairs, acc);
  }
  parallel_for(nq, [&](int64_t i0, int64_t i1) {
    for (int t = 1; t < threads; ++t) {
      const float* src = dq_partial.data() + size_t(t - 1) * size_t(nq);
#pragma omp simd
      for (int64_t i = i0; i < i1; ++i) dq[i] += src[i];
    }
  }, 4096);
}

}  // namespace ktune::cpu
