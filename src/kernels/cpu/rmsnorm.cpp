// RMSNorm rows in parallel. The backward's dw is a column sum over rows: each thread sums its rows
// into a private (C) buffer and the buffers are added in thread order (deterministic for a thread count).
//   y = x r w',  r = (mean(x^2) + eps)^-1/2,  w' = offset + w
//   dx = r (dy w') - x r^3 / C * sum(dy w' x),   dw += sum_rows(dy x r)
#include "kernels/cpu/rmsnorm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/parallel.h"

namespace ktune::cpu {

void rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, int64_t N, int64_t C, float eps,
                     float weight_offset) {
  parallel_for(N, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * C;
      float* yr = y + r * C;
      float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
      for (int64_t c = 0; c < C; ++c) ss += xr[c] * xr[c];
      float rs = 1.0f / std::sqrt(ss / float(C) + eps);
      rstd[r] = rs;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) yr[c] = (xr[c] * rs) * (weight_offset + w[c]);
    }
  }, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, C)));
}

void rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x, const float* w, const float* rstd,
                      int64_t N, int64_t C, float weight_offset) {
  int threads = num_threads();
  std::vector<float> dw_partial(dw ? size_t(threads) * size_t(C) : 0, 0.0f);
  std::vector<int> used(size_t(threads), 0);
  parallel_for(N, [&](int64_t r0, int64_t r1) {
    int t = omp_get_thread_num();
    float* dwt = dw ? dw_partial.data() + size_t(t) * size_t(C) : nullptr;
    used[size_t(t)] = 1;
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * C;
      const float* dyr = dy + r * C;
      float* dxr = dx + r * C;
      float rs = rstd[r];
      float dot = 0.0f;  // sum(dy w' x)
#pragma omp simd reduction(+ : dot)
      for (int64_t c = 0; c < C; ++c) dot += dyr[c] * (weight_offset + w[c]) * xr[c];
      float k = dot * rs * rs * rs / float(C);
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) dxr[c] = rs * dyr[c] * (weight_offset + w[c]) - xr[c] * k;
      if (dwt) {
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) dwt[c] += dyr[c] * xr[c] * rs;
      }
    }
  }, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, C)));
  if (dw)
    for (int t = 0; t < threads; ++t) {
      if (!used[size_t(t)]) continue;
      const float* dwt = dw_partial.data() + size_t(t) * size_t(C);
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) dw[c] += dwt[c];
    }
}

void rmsnorm_forward_reference(float* y, float* rstd, const float* x, const float* w, int64_t N, int64_t C,
                               float eps, float weight_offset) {
  for (int64_t r = 0; r < N; ++r) {
    double ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += double(x[r * C + c]) * x[r * C + c];
    double rs = 1.0 / std::sqrt(ss / double(C) + double(eps));
    rstd[r] = float(rs);
    for (int64_t c = 0; c < C; ++c) y[r * C + c] = float(x[r * C + c] * rs * (double(weight_offset) + w[c]));
  }
}

void rmsnorm_backward_reference(float* dx, float* dw, const float* dy, const float* x, const float* w,
                                const float* rstd, int64_t N, int64_t C, float weight_offset) {
  for (int64_t r = 0; r < N; ++r) {
    double rs = rstd[r];
    double dot = 0;
    for (int64_t c = 0; c < C; ++c) dot += double(dy[r * C + c]) * (double(weight_offset) + w[c]) * x[r * C + c];
    for (int64_t c = 0; c < C; ++c) {
      double g = double(dy[r * C + c]) * (double(weight_offset) + w[c]);
      dx[r * C + c] = float(rs * g - double(x[r * C + c]) * rs * rs * rs * dot / double(C));
      if (dw) dw[c] += float(double(dy[r * C + c]) * x[r * C + c] * rs);
    }
  }
}

}  // namespace ktune::cpu
