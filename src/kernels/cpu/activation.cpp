// Elementwise ops, vectorised with `omp simd` and split across threads in contiguous chunks.
// exp/tanh are vector_math.h's polynomials (the references use std:: in double).
#include "kernels/cpu/activation.h"

#include <cmath>

#include "core/parallel.h"
#include "kernels/cpu/vector_math.h"

namespace ktune::cpu {
namespace {

constexpr int64_t kGrain = 16384;  // elements a thread must have before a split pays
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCoeff = 0.044715f;

}  // namespace

void swiglu_forward(float* out, const float* gate, const float* up, int64_t n) {
  parallel_for(n, [&](int64_t i0, int64_t i1) {
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i) {
      float g = gate[i];
      out[i] = g / (1.0f + vexp(-g)) * up[i];
    }
  }, kGrain);
}

void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t n) {
  parallel_for(n, [&](int64_t i0, int64_t i1) {
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i) {
      float g = gate[i], u = up[i], d = dout[i];
      float sig = 1.0f / (1.0f + vexp(-g));
      float silu = g * sig;
      dgate[i] = d * u * sig * (1.0f + g * (1.0f - sig));
      dup[i] = d * silu;
    }
  }, kGrain);
}

void geglu_tanh_forward(float* out, const float* gate, const float* up, int64_t n) {
  parallel_for(n, [&](int64_t i0, int64_t i1) {
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i) {
      float g = gate[i];
      float t = vtanh(kSqrt2OverPi * (g + kGeluCoeff * g * g * g));
      out[i] = 0.5f * g * (1.0f + t) * up[i];
    }
  }, kGrain);
}

void geglu_tanh_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                         int64_t n) {
  parallel_for(n, [&](int64_t i0, int64_t i1) {
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i) {
      float g = gate[i], u = up[i], d = dout[i];
      float t = vtanh(kSqrt2OverPi * (g + kGeluCoeff * g * g * g));
      float gelu = 0.5f * g * (1.0f + t);
      float dgelu = 0.5f * (1.0f + t) + 0.5f * g * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * kGeluCoeff * g * g);
      dgate[i] = d * u * dgelu;
      dup[i] = d * gelu;
    }
  }, kGrain);
}

void add_inplace(float* y, const float* x, int64_t n) {
  parallel_for(n, [&](int64_t i0, int64_t i1) {
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i) y[i] += x[i];
  }, kGrain * 4);
}

void softcap_forward(float* x, int64_t n, float cap) {
  const float inv = 1.0f / cap;
  parallel_for(n, [&](int64_t i0, int64_t i1) {
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i) x[i] = cap * vtanh(x[i] * inv);
  }, kGrain);
}

void softcap_backward(float* dx, const float* y, int64_t n, float cap) {
  const float inv = 1.0f / cap;
  parallel_for(n, [&](int64_t i0, int64_t i1) {
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i) {
      float t = y[i] * inv;
      dx[i] *= 1.0f - t * t;
    }
  }, kGrain);
}

void swiglu_forward_reference(float* out, const float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    double g = gate[i];
    out[i] = float(g / (1.0 + std::exp(-g)) * up[i]);
  }
}

void swiglu_backward_reference(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                               int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    double g = gate[i], sig = 1.0 / (1.0 + std::exp(-g));
    dgate[i] = float(double(dout[i]) * up[i] * (sig + g * sig * (1.0 - sig)));
    dup[i] = float(double(dout[i]) * g * sig);
  }
}

void geglu_tanh_forward_reference(float* out, const float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    double g = gate[i];
    double t = std::tanh(std::sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g));
    out[i] = float(0.5 * g * (1.0 + t) * up[i]);
  }
}

void geglu_tanh_backward_reference(float* dgate, float* dup, const float* dout, const float* gate,
                                   const float* up, int64_t n) {
  const double k = std::sqrt(2.0 / M_PI);
  for (int64_t i = 0; i < n; ++i) {
    double g = gate[i];
    double t = std::tanh(k * (g + 0.044715 * g * g * g));
    double dgelu = 0.5 * (1.0 + t) + 0.5 * g * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * g * g);
    dgate[i] = float(double(dout[i]) * up[i] * dgelu);
    dup[i] = float(double(dout[i]) * 0.5 * g * (1.0 + t));
  }
}

}  // namespace ktune::cpu
