// RMSNorm, as Hugging Face computes it in f32: y = x * rsqrt(mean(x^2) + eps) * (weight_offset + w).
// Llama/Qwen/Mistral use weight_offset = 0; Gemma stores w - 1 and uses weight_offset = 1.
// It deliberately does not fuse the residual add (callers add first, see activation.h).
#pragma once

#include <cstdint>

namespace ktune::cpu {

// x, y: (N, C)   w: (C)   rstd: (N) saved for the backward
void rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, int64_t N, int64_t C, float eps,
                     float weight_offset);
// Undoes y = x * rstd * (weight_offset + w): dx overwritten (N, C); dw (C) accumulates (+=), may be nullptr.
void rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x, const float* w, const float* rstd,
                      int64_t N, int64_t C, float weight_offset);

void rmsnorm_forward_reference(float* y, float* rstd, const float* x, const float* w, int64_t N, int64_t C,
                               float eps, float weight_offset);
void rmsnorm_backward_reference(float* dx, float* dw, const float* dy, const float* x, const float* w,
                                const float* rstd, int64_t N, int64_t C, float weight_offset);

}  // namespace ktune::cpu
