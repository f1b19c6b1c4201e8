// The plain attention that the tiled one is tested against: the full (T, T) scores of one head in
// double, masked, softmaxed, multiplied out. Slow and O(T^2) memory by design.
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/attention.h"

namespace ktune::cpu {
namespace {

bool visible(const AttentionShape& s, const int32_t* doc_ids, int64_t b, int64_t i, int64_t j) {
  if (j > i) return false;
  if (s.sliding_window > 0 && !(i - s.sliding_window < j)) return false;
  if (doc_ids && doc_ids[b * s.T + i] != doc_ids[b * s.T + j]) return false;
  return true;
}

// P (T, T) of one (b, h) and, when wanted, the tanh of the capped scores (for the backward).
void probabilities(std::vector<double>& P, std::vector<double>& tanh_s, std::vector<double>& lse, const float* q,
                   const float* k, const int32_t* doc_ids, const AttentionShape& s, int64_t b, int64_t h) {
  const int64_t T = s.T, D = s.D, kvh = h / (s.Hq / s.Hkv);
  P.assign(size_t(T * T), 0.0);
  tanh_s.assign(size_t(T * T), 0.0);
  lse.assign(size_t(T), 0.0);
  for (int64_t i = 0; i < T; ++i) {
    const float* qi = q + ((b * T + i) * s.Hq + h) * D;
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < T; ++j) {
      if (!visible(s, doc_ids, b, i, j)) continue;
      const float* kj = k + ((b * T + j) * s.Hkv + kvh) * D;
      double dot = 0;
      for (int64_t d = 0; d < D; ++d) dot += double(qi[d]) * kj[d];
      double x = dot * s.scale;
      if (s.softcap > 0) {
        double t = std::tanh(x / s.softcap);
        tanh_s[size_t(i * T + j)] = t;
        x = s.softcap * t;
      }
      P[size_t(i * T + j)] = x;
      m = std::max(m, x);
    }
    double sum = 0;
    for (int64_t j = 0; j < T; ++j)
      if (visible(s, doc_ids, b, i, j)) sum += std::exp(P[size_t(i * T + j)] - m);
    lse[size_t(i)] = m + std::log(sum);
    for (int64_t j = 0; j < T; ++j)
      P[size_t(i * T + j)] = visible(s, doc_ids, b, i, j) ? std::exp(P[size_t(i * T + j)] - lse[size_t(i)]) : 0.0;
  }
}

}  // namespace

void attention_forward_reference(float* out, float* lse, const float* q, const float* k, const float* v,
                                 const int32_t* doc_ids, const AttentionShape& s) {
  const int64_t T = s.T, D = s.D;
  std::vector<double> P, tanh_s, l;
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.Hq; ++h) {
      const int64_t kvh = h / (s.Hq / s.Hkv);
      probabilities(P, tanh_s, l, q, k, doc_ids, s, b, h);
      for (int64_t i = 0; i < T; ++i) {
        lse[(b * s.Hq + h) * T + i] = float(l[size_t(i)]);
        for (int64_t d = 0; d < D; ++d) {
          double acc = 0;
          for (int64_t j = 0; j < T; ++j) acc += P[size_t(i * T + j)] * v[((b * T + j) * s.Hkv + kvh) * D + d];
          out[((b * T + i) * s.Hq + h) * D + d] = float(acc);
        }
      }
    }
}

void attention_backward_reference(float* dq, float* dk, float* dv, const float* dout, const float* q,
                                  const float* k, const float* v, const float* out, const float* lse,
                                  const int32_t* doc_ids, const AttentionShape& s) {
  const int64_t T = s.T, D = s.D;
  const int64_t n_q = s.B * T * s.Hq * D, n_kv = s.B * T * s.Hkv * D;
  std::vector<double> dq_acc(size_t(n_q), 0.0), dk_acc(size_t(n_kv), 0.0), dv_acc(size_t(n_kv), 0.0);
  std::vector<double> P, tanh_s, l, dP(size_t(T * T));
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.Hq; ++h) {
      const int64_t kvh = h / (s.Hq / s.Hkv);
      probabilities(P, tanh_s, l, q, k, doc_ids, s, b, h);
      auto qi = [&](int64_t i) { return ((b * T + i) * s.Hq + h) * D; };
      auto kj = [&](int64_t j) { return ((b * T + j) * s.Hkv + kvh) * D; };
      for (int64_t i = 0; i < T; ++i) {
        // dP = dout v^T ; dS = P (dP - sum_j P dP) ; through the cap ; dq = dS k scale, dk = dS^T q scale
        double rowdot = 0;
        for (int64_t j = 0; j < T; ++j) {
          double acc = 0;
          for (int64_t d = 0; d < D; ++d) acc += double(dout[qi(i) + d]) * v[kj(j) + d];
          dP[size_t(i * T + j)] = acc;
          rowdot += P[size_t(i * T + j)] * acc;
        }
        for (int64_t j = 0; j < T; ++j) {
          double p = P[size_t(i * T + j)];
          if (p == 0.0) continue;
          double ds = p * (dP[size_t(i * T + j)] - rowdot);
          if (s.softcap > 0) {
            double t = tanh_s[size_t(i * T + j)];
            ds *= 1.0 - t * t;
          }
          ds *= s.scale;
          for (int64_t d = 0; d < D; ++d) {
            dq_acc[size_t(qi(i) + d)] += ds * k[kj(j) + d];
            dk_acc[size_t(kj(j) + d)] += ds * q[qi(i) + d];
            dv_acc[size_t(kj(j) + d)] += p * dout[qi(i) + d];
          }
        }
      }
    }
  for (int64_t i = 0; i < n_q; ++i) dq[i] = float(dq_acc[size_t(i)]);
  for (int64_t i = 0; i < n_kv; ++i) {
    dk[i] = float(dk_acc[size_t(i)]);
    dv[i] = float(dv_acc[size_t(i)]);
  }
}

}  // namespace ktune::cpu
