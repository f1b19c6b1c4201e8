// Linear layers in the Hugging Face layout: y = x @ W^T + b with W (out, in).
// Thin wrappers over gemm() plus the bias; the backward produces any subset of dx, dW, db
// (a frozen base passes dw = nullptr and costs no weight-gradient GEMM).
// It deliberately knows nothing of LoRA or quantisation (model/ and nf4.h compose those).
#pragma once

#include <cstdint>

namespace ktune::cpu {

// y = x @ W^T + b.   x (N, in)   W (out, in)   b (out) or nullptr   y (N, out)
void linear_forward(float* y, const float* x, const float* w, const float* b, int64_t N, int64_t in, int64_t out);
// Undoes y = x @ W^T + b:  dx = dy @ W (overwritten, or added when accumulate_dx),
// dW += dy^T @ x, db += sum_rows(dy). Any of dx, dw, db may be nullptr.
// dy (N, out)   x (N, in)   w (out, in)   dx (N, in)   dw (out, in)   db (out)
void linear_backward(float* dx, float* dw, float* db, const float* dy, const float* x, const float* w,
                     int64_t N, int64_t in, int64_t out, bool accumulate_dx);

void linear_forward_reference(float* y, const float* x, const float* w, const float* b, int64_t N, int64_t in,
                              int64_t out);
void linear_backward_reference(float* dx, float* dw, float* db, const float* dy, const float* x, const float* w,
                               int64_t N, int64_t in, int64_t out, bool accumulate_dx);

}  // namespace ktune::cpu
