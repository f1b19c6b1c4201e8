// Linear layers in the Hugging Face layout: y = x @ W^T + b with W (out, in).
// Thin wrappers over gemm() plus the bias; the backward produces any subset of dx, dW, db
// (a frozen base passes dw = nullptr and costs no weight-gradient GEMM).
// It deliberately knows nothing of LoRA or quantisation (model/ and nf4.h compose those).
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace ktune::cpu {

// y = x @ W^T + b.   x (N, in)   W (out, in)   b (out) or nullptr   y (N, out)
void linear_forward(float* y, const float* x, const float* w, const float* b, int64_t N, int64_t in, int64_t out);
// Undoes y = x @ W^T + b:  dx = dy @ W (overwritten, or added when accumulate_dx),
// dW += dy^T @ x, db += sum_rows(dy). Any of dx, dw, db may be nullptr.
// dy (N, out)   x (N, in)   w (out, in)   dx (N, in)   dw (out, in)   db (out)
void linear_backward(float* dx, float* dw, float* db, const float* dy, const float* x, const float* w,
                     int64_t N, int64_t in, int64_t out, bool accumulate_dx);

// y = x @ widen(W)^T + widen(b) for a bf16-stored W on few rows of x (decoding: a token a sequence),
// on CPUs where bf16 is not multiplied natively: each row of W is widened to f32 once, as it is read,
// into a thread's buffer and multiplied by every row of x there, so a step reads W's 2 bytes a value
// once instead of widening all of W into an f32 copy (4 bytes written, then read) first. The same
// product as widening W then linear_forward, in another order of summation. x stays f32.
// x (N, in)   W (out, in) bf16   b (out) bf16 or nullptr   y (N, out)
constexpr int64_t kWideningRowsMax = 4;  // N above this: widen W once and run the GEMM instead
void linear_forward_widening_bf16(float* y, const float* x, const bf16_t* w, const bf16_t* b, int64_t N, int64_t in,
                                  int64_t out);

// A bf16-stored weight multiplied as bf16 (gemm_bf16: bf16 operands, f32 accumulation and result).
// The activation operand arrives already rounded to bf16 (round_to_bf16, kernels/cpu/bf16_rounding.h):
// x16 = bf16(x) (N, in), dy16 = bf16(dy) (N, out). W (out, in) bf16, b (out) bf16 or nullptr.
// y (N, out) = x16 @ W^T + b
void linear_forward_bf16(float* y, const bf16_t* x16, const bf16_t* w, const bf16_t* b, int64_t N, int64_t in,
                         int64_t out);
// Undoes y = x @ W^T for x:  dx (N, in) = dy16 @ W, overwritten (or added when accumulate_dx).
void linear_backward_input_bf16(float* dx, const bf16_t* dy16, const bf16_t* w, int64_t N, int64_t in, int64_t out,
                                bool accumulate_dx);
// Undoes y = x @ W^T for W, rows [o0, o0 + rows) of it:  dw (rows, in) = dy16[:, o0:o0+rows]^T @ x16 + beta * dw.
void linear_backward_weight_bf16(float* dw, const bf16_t* dy16, const bf16_t* x16, int64_t N, int64_t in,
                                 int64_t out, int64_t o0, int64_t rows, float beta);
// The same into a bf16 gradient, dw16 (out, in) += dy16^T @ x16, without an (out, in) f32 buffer: a
// block of weight_gradient_block_rows(out, in) rows at a time is summed in f32 in `block` and added
// with one rounding. Projections and the output head (W = (V, C)) take their bf16 dW this way.
constexpr int64_t kWeightGradientBlockFloats = int64_t(1) << 20;  // 4 MiB of f32 dW rows
int64_t weight_gradient_block_rows(int64_t out, int64_t in);
// block: weight_gradient_block_rows(out, in) * in floats.
void linear_backward_weight_bf16_blocks(bf16_t* dw16, const bf16_t* dy16, const bf16_t* x16, int64_t N, int64_t in,
                                        int64_t out, float* block);

void linear_forward_reference(float* y, const float* x, const float* w, const float* b, int64_t N, int64_t in,
                              int64_t out);
void linear_backward_reference(float* dx, float* dw, float* db, const float* dy, const float* x, const float* w,
                               int64_t N, int64_t in, int64_t out, bool accumulate_dx);

}  // namespace ktune::cpu
