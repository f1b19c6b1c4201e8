// Embedding lookup (rows copied in parallel) and its scatter-add backward, parallel over columns
// so that two tokens with the same id never race.
#include "kernels/cpu/embedding.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "core/parallel.h"

namespace ktune::cpu {
namespace {

void check_ids(const int32_t* ids, int64_t N, int64_t V) {
  for (int64_t i = 0; i < N; ++i)
    if (ids[i] < 0 || (V > 0 && ids[i] >= V))
      throw Error("embedding: token " + std::to_string(i),
                  "id " + std::to_string(ids[i]) + " outside the table" + (V > 0 ? " of " + std::to_string(V) + " rows" : ""));
}

}  // namespace

void embedding_forward(float* out, const int32_t* ids, const float* table, int64_t N, int64_t C, int64_t V,
                       float scale) {
  check_ids(ids, N, V);
  parallel_for(N, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* src = table + int64_t(ids[r]) * C;
      float* dst = out + r * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) dst[c] = src[c] * scale;
    }
  }, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, C)));
}

void embedding_forward(float* out, const int32_t* ids, const float* table, int64_t N, int64_t C, float scale) {
  embedding_forward(out, ids, table, N, C, 0, scale);
}

void embedding_backward(float* dtable, const float* dout, const int32_t* ids, int64_t N, int64_t C, float scale) {
  check_ids(ids, N, 0);
  parallel_for(C, [&](int64_t c0, int64_t c1) {
    for (int64_t r = 0; r < N; ++r) {
      float* dst = dtable + int64_t(ids[r]) * C;
      const float* src = dout + r * C;
#pragma omp simd
      for (int64_t c = c0; c < c1; ++c) dst[c] += src[c] * scale;
    }
  }, std::max<int64_t>(64, 16384 / std::max<int64_t>(1, N)));
}

void embedding_forward_reference(float* out, const int32_t* ids, const float* table, int64_t N, int64_t C,
                                 float scale) {
  for (int64_t r = 0; r < N; ++r)
    for (int64_t c = 0; c < C; ++c) out[r * C + c] = table[int64_t(ids[r]) * C + c] * scale;
}

void embedding_backward_reference(float* dtable, const float* dout, const int32_t* ids, int64_t N, int64_t C,
                                  float scale) {
  for (int64_t r = 0; r < N; ++r)
    for (int64_t c = 0; c < C; ++c) dtable[int64_t(ids[r]) * C + c] += dout[r * C + c] * scale;
}

}  // namespace ktune::cpu
