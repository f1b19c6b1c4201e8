// One (query, head) at a time: its scores against the keys it sees in one pass, a max-subtracted
// softmax, then the weighted sum of values. A decoding step has one query, so the work is spread
// over the heads (and the queries, when new tokens follow earlier ones).
// A prompt fed whole into an empty cache (past == 0, n > 1) is training's causal attention over n
// tokens, whose keys and values are laid out as training's (1, n, Hkv, D): it goes to
// attention_forward's tiles (5x faster at 280 tokens, 9x at 1000, on 2 AVX2 threads), its lse into a
// scratch nothing reads.
#include "kernels/cpu/cached_attention.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "kernels/cpu/attention.h"

namespace ktune::cpu {

namespace {

// out (D) = softmax over j in [first, last] of cap(scale q.k_j), times v_j; scores: room for last + 1.
void attend_one(float* out, const float* q, const float* k, const float* v, int64_t first, int64_t last,
                const CachedAttentionShape& s, int64_t kv_head, float* scores) {
  const int64_t D = s.D, stride = s.Hkv * s.D;
  float max_score = -INFINITY;
  for (int64_t j = first; j <= last; ++j) {
    const float* kj = k + j * stride + kv_head * D;
    float dot = 0;
#pragma omp simd reduction(+ : dot)
    for (int64_t d = 0; d < D; ++d) dot += q[d] * kj[d];
    float x = dot * s.scale;
    if (s.softcap > 0) x = s.softcap * std::tanh(x / s.softcap);
    scores[j] = x;
    max_score = std::max(max_score, x);
  }
  float sum = 0;
  for (int64_t j = first; j <= last; ++j) {
    scores[j] = std::exp(scores[j] - max_score);
    sum += scores[j];
  }
  std::fill(out, out + D, 0.0f);
  for (int64_t j = first; j <= last; ++j) {
    const float p = scores[j] / sum;
    const float* vj = v + j * stride + kv_head * D;
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) out[d] += p * vj[d];
  }
}

}  // namespace

void cached_attention_forward(float* out, const float* q, const float* k, const float* v, const CachedAttentionShape& s) {
  if (s.n <= 0 || s.length < s.n)
    throw Error("cached_attention", "needs 0 < n <= length (n=" + std::to_string(s.n) + ", length=" +
                                        std::to_string(s.length) + ")");
  if (s.Hkv <= 0 || s.Hq % s.Hkv != 0)
    throw Error("cached_attention", "query heads (" + std::to_string(s.Hq) + ") must be a multiple of kv heads (" +
                                        std::to_string(s.Hkv) + ")");
  const int64_t past = s.length - s.n, group = s.Hq / s.Hkv, D = s.D;
  if (past == 0 && s.n > 1) {  // a whole prompt: q (1, n, Hq, D), k and v (1, n, Hkv, D)
    std::vector<float> lse(static_cast<size_t>(s.Hq * s.n));
    const AttentionShape whole{1, s.n, s.Hq, s.Hkv, s.D, s.scale, s.sliding_window, s.softcap};
    attention_forward(out, lse.data(), q, k, v, nullptr, whole);
    return;
  }
  parallel_for(s.n * s.Hq, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(static_cast<size_t>(s.length));
    for (int64_t item = begin; item < end; ++item) {
      const int64_t i = item / s.Hq, h = item % s.Hq;
      const int64_t last = past + i;
      const int64_t first = s.sliding_window > 0 ? std::max<int64_t>(0, last - s.sliding_window + 1) : 0;
      attend_one(out + (i * s.Hq + h) * D, q + (i * s.Hq + h) * D, k, v, first, last, s, h / group, scores.data());
    }
  }, 2);
}

}  // namespace ktune::cpu
