// Fused output projection + cross-entropy in chunks (see cross_entropy.h). A chunk is a run of at
// most chunk_tokens consecutive tokens whose labels are all valid, so hidden and dhidden rows are
// contiguous and ignored tokens cost nothing. Per chunk, in scratch (rows, V):
//   logits = hidden @ W^T;  [z = cap tanh(logits/cap)];  lse;  loss += lse - z[label]
//   dlogits = grad_scale (softmax(z) - onehot) [* (1 - (z/cap)^2)]   (in place)
//   dhidden = dlogits @ W;  dW += dlogits^T @ hidden
#include "kernels/cpu/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/vector_math.h"

namespace ktune::cpu {

size_t linear_cross_entropy_scratch_floats(int64_t chunk_tokens, int64_t V) { return size_t(chunk_tokens * V); }

double linear_cross_entropy(float* dhidden, float* dweight, int64_t* n_valid, const float* hidden,
                            const float* weight, const int32_t* labels, int64_t N, int64_t C, int64_t V,
                            float softcap, float grad_scale, int64_t chunk_tokens, float* scratch) {
  check(chunk_tokens > 0, "cross_entropy", "chunk_tokens must be positive");
  for (int64_t r = 0; r < N; ++r)
    if (labels[r] != kIgnoreIndex && (labels[r] < 0 || labels[r] >= V))
      throw Error("cross_entropy: token " + std::to_string(r),
                  "label " + std::to_string(labels[r]) + " outside [0, " + std::to_string(V) + ") and not -100");
  const bool want_grad = dhidden || dweight;
  const float inv_cap = softcap > 0 ? 1.0f / softcap : 0.0f;
  double total = 0.0;
  int64_t count = 0;
  std::vector<double> row_loss(static_cast<size_t>(chunk_tokens));
  int64_t r = 0;
  while (r < N) {
    if (labels[r] == kIgnoreIndex) {
      if (dhidden) std::fill(dhidden + r * C, dhidden + (r + 1) * C, 0.0f);
      ++r;
      continue;
    }
    int64_t r0 = r, r1 = r;
    while (r1 < N && r1 - r0 < chunk_tokens && labels[r1] != kIgnoreIndex) ++r1;
    const int64_t rows = r1 - r0;
    const float* h = hidden + r0 * C;
    float* logits = scratch;  // (rows, V)
    gemm(false, true, rows, V, C, 1.0f, h, weight, 0.0f, logits);
    parallel_for(rows, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        float* z = logits + i * V;
        if (softcap > 0) {
#pragma omp simd
          for (int64_t c = 0; c < V; ++c) z[c] = softcap * vtanh(z[c] * inv_cap);
        }
        float m = -INFINITY;
#pragma omp simd reduction(max : m)
        for (int64_t c = 0; c < V; ++c) m = std::max(m, z[c]);
        float sum = 0.0f;
        if (want_grad) {
          const int32_t label = labels[r0 + i];
          const float z_label = z[label];
          if (softcap > 0) {
            // z holds the capped logits; cap'(.) = 1 - (z/cap)^2 is read before z is overwritten.
#pragma omp simd reduction(+ : sum)
            for (int64_t c = 0; c < V; ++c) sum += vexp(z[c] - m);
            const float inv_sum = grad_scale / sum;
#pragma omp simd
            for (int64_t c = 0; c < V; ++c) {
              float t = z[c] * inv_cap;
              z[c] = vexp(z[c] - m) * inv_sum * (1.0f - t * t);
            }
            const float t = z_label * inv_cap;
            z[label] -= grad_scale * (1.0f - t * t);
          } else {
#pragma omp simd reduction(+ : sum)
            for (int64_t c = 0; c < V; ++c) {
              float e = vexp(z[c] - m);
              z[c] = e;
              sum += e;
            }
            const float inv_sum = grad_scale / sum;
#pragma omp simd
            for (int64_t c = 0; c < V; ++c) z[c] *= inv_sum;
            z[label] -= grad_scale;
          }
          row_loss[size_t(i)] = double(m + std::log(sum)) - double(z_label);
        } else {
#pragma omp simd reduction(+ : sum)
          for (int64_t c = 0; c < V; ++c) sum += vexp(z[c] - m);
          row_loss[size_t(i)] = double(m + std::log(sum)) - double(z[labels[r0 + i]]);
        }
      }
    }, std::max<int64_t>(1, 65536 / V));
    for (int64_t i = 0; i < rows; ++i) total += row_loss[size_t(i)];
    count += rows;
    if (dhidden) gemm(false, false, rows, C, V, 1.0f, logits, weight, 0.0f, dhidden + r0 * C);  // (rows,V)@(V,C)
    if (dweight) gemm(true, false, V, C, rows, 1.0f, logits, h, 1.0f, dweight);                 // (V,rows)@(rows,C)
    r = r1;
  }
  if (n_valid) *n_valid = count;
  return total;
}

}  // namespace ktune::cpu
