// Linear layers over gemm(): the forward is one GEMM plus a bias broadcast, the backward up to
// two GEMMs (dx, dW) plus a column sum (db); the bf16 variants the same on bf16 operands.
#include "kernels/cpu/linear.h"

#include <algorithm>
#include <vector>

#include "core/parallel.h"
#include "kernels/cpu/bf16_rounding.h"
#include "kernels/cpu/gemm.h"

namespace ktune::cpu {

void linear_forward(float* y, const float* x, const float* w, const float* b, int64_t N, int64_t in, int64_t out) {
  if (b) {
    // y = b broadcast, then y += x @ W^T (the bias rides the GEMM's beta).
    parallel_for(N, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        float* yr = y + r * out;
#pragma omp simd
        for (int64_t j = 0; j < out; ++j) yr[j] = b[j];
      }
    }, 64);
    gemm(false, true, N, out, in, 1.0f, x, w, 1.0f, y);
  } else {
    gemm(false, true, N, out, in, 1.0f, x, w, 0.0f, y);
  }
}

namespace {

// x . widen(w) over k < in, f32: kLanes independent partial sums, so that the multiply-adds of
// consecutive vectors do not wait on each other (one running sum would wait a multiply-add's
// latency per vector), then the tail.
constexpr int64_t kLanes = 32;
float dot_widening(const float* x, const bf16_t* w, int64_t in) {
  float partial[kLanes] = {};
  int64_t k = 0;
  for (; k + kLanes <= in; k += kLanes) {
#pragma omp simd
    for (int64_t j = 0; j < kLanes; ++j) partial[j] += x[k + j] * bf16_to_f32(w[k + j]);
  }
  float dot = 0;
  for (; k < in; ++k) dot += x[k] * bf16_to_f32(w[k]);
  for (int64_t j = 0; j < kLanes; ++j) dot += partial[j];
  return dot;
}

}  // namespace

void linear_forward_widening_bf16(float* y, const float* x, const bf16_t* w, const bf16_t* b, int64_t N, int64_t in,
                                  int64_t out) {
  // Each thread a block of output features; a row of W is read from memory once and from the
  // cache for the other rows of x.
  parallel_for(out, [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o) {
      const bf16_t* wo = w + o * in;
      const float bias = b ? bf16_to_f32(b[o]) : 0.0f;
      for (int64_t n = 0; n < N; ++n) y[n * out + o] = dot_widening(x + n * in, wo, in) + bias;
    }
  }, 16);
}

void linear_backward(float* dx, float* dw, float* db, const float* dy, const float* x, const float* w,
                     int64_t N, int64_t in, int64_t out, bool accumulate_dx) {
  if (dx) gemm(false, false, N, in, out, 1.0f, dy, w, accumulate_dx ? 1.0f : 0.0f, dx);  // (N,out)@(out,in)
  if (dw) gemm(true, false, out, in, N, 1.0f, dy, x, 1.0f, dw);                          // (out,N)@(N,in)
  if (db) {
    // Columns split across threads: each owns a slice of db, rows summed in order.
    parallel_for(out, [&](int64_t c0, int64_t c1) {
      for (int64_t r = 0; r < N; ++r) {
        const float* dyr = dy + r * out;
#pragma omp simd
        for (int64_t j = c0; j < c1; ++j) db[j] += dyr[j];
      }
    }, 256);
  }
}

void linear_forward_bf16(float* y, const bf16_t* x16, const bf16_t* w, const bf16_t* b, int64_t N, int64_t in,
                         int64_t out) {
  if (b) {
    parallel_for(N, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        float* yr = y + r * out;
#pragma omp simd
        for (int64_t j = 0; j < out; ++j) yr[j] = bf16_to_f32(b[j]);
      }
    }, 64);
  }
  gemm_bf16(false, true, N, out, in, 1.0f, x16, w, b ? 1.0f : 0.0f, y);  // (N,in)@(in,out)
}

void linear_backward_input_bf16(float* dx, const bf16_t* dy16, const bf16_t* w, int64_t N, int64_t in, int64_t out,
                                bool accumulate_dx) {
  gemm_bf16(false, false, N, in, out, 1.0f, dy16, w, accumulate_dx ? 1.0f : 0.0f, dx);  // (N,out)@(out,in)
}

void linear_backward_weight_bf16(float* dw, const bf16_t* dy16, const bf16_t* x16, int64_t N, int64_t in,
                                 int64_t out, int64_t o0, int64_t rows, float beta) {
  // (rows,N)@(N,in): dy16's columns o0.. read as a transposed, strided A.
  gemm_bf16_strided(true, false, rows, in, N, 1.0f, dy16 + o0, out, x16, in, beta, dw, in);
}

int64_t weight_gradient_block_rows(int64_t out, int64_t in) {
  return std::clamp<int64_t>(kWeightGradientBlockFloats / std::max<int64_t>(in, 1), 1, out);
}

void linear_backward_weight_bf16_blocks(bf16_t* dw16, const bf16_t* dy16, const bf16_t* x16, int64_t N, int64_t in,
                                        int64_t out, float* block) {
  const int64_t block_rows = weight_gradient_block_rows(out, in);
  for (int64_t o0 = 0; o0 < out; o0 += block_rows) {
    const int64_t rows = std::min(block_rows, out - o0);
    linear_backward_weight_bf16(block, dy16, x16, N, in, out, o0, rows, 0.0f);  // (rows, in)
    add_rounded_to_bf16(dw16 + o0 * in, block, rows * in);
  }
}

void linear_forward_reference(float* y, const float* x, const float* w, const float* b, int64_t N, int64_t in,
                              int64_t out) {
  for (int64_t r = 0; r < N; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double acc = b ? b[o] : 0.0;
      for (int64_t i = 0; i < in; ++i) acc += double(x[r * in + i]) * w[o * in + i];
      y[r * out + o] = float(acc);
    }
}

void linear_backward_reference(float* dx, float* dw, float* db, const float* dy, const float* x, const float* w,
                               int64_t N, int64_t in, int64_t out, bool accumulate_dx) {
  if (dx)
    for (int64_t r = 0; r < N; ++r)
      for (int64_t i = 0; i < in; ++i) {
        double acc = accumulate_dx ? dx[r * in + i] : 0.0;
        for (int64_t o = 0; o < out; ++o) acc += double(dy[r * out + o]) * w[o * in + i];
        dx[r * in + i] = float(acc);
      }
  if (dw)
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) {
        double acc = dw[o * in + i];
        for (int64_t r = 0; r < N; ++r) acc += double(dy[r * out + o]) * x[r * in + i];
        dw[o * in + i] = float(acc);
      }
  if (db)
    for (int64_t o = 0; o < out; ++o) {
      double acc = db[o];
      for (int64_t r = 0; r < N; ++r) acc += dy[r * out + o];
      db[o] = float(acc);
    }
}

}  // namespace ktune::cpu
