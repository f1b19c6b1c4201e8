// RMSNorm on the GPU with the CPU op's conventions (kernels/cpu/rmsnorm.h), computed in f32:
// y = x * rsqrt(mean(x^2) + eps) * (weight_offset + w). x, y, w, dy, dx are f32 or bf16 (one type);
// rstd is f32; dw is f32 and accumulates. The backward's dw is a column sum done in a fixed order
// (deterministic). It deliberately does not fuse the residual add.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "kernels/cuda/gemm.h"

namespace ktune::cuda {

// x, y: (N, C)   w: (C)   rstd: (N) saved for the backward
void rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, int64_t N, int64_t C, float eps,
                     float weight_offset, Stream stream = nullptr);
void rmsnorm_forward(bf16_t* y, float* rstd, const bf16_t* x, const bf16_t* w, int64_t N, int64_t C, float eps,
                     float weight_offset, Stream stream = nullptr);
// Undoes y = x * rstd * (weight_offset + w): dx overwritten (N, C); dw (C) f32 += (may be nullptr).
void rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x, const float* w, const float* rstd,
                      int64_t N, int64_t C, float weight_offset, Stream stream = nullptr);
void rmsnorm_backward(bf16_t* dx, float* dw, const bf16_t* dy, const bf16_t* x, const bf16_t* w, const float* rstd,
                      int64_t N, int64_t C, float weight_offset, Stream stream = nullptr);

}  // namespace ktune::cuda
