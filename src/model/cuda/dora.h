// DoRA's elementwise pieces on the GPU, for cuda::Decoder (the CPU LoraAdapter's math,
// src/model/adapters/lora_adapter.cpp; PEFT's, the weight norm detached):
//   y = c ⊙ pre + b,  pre = x Wᵀ + s (x Aᵀ) Bᵀ,  c = m / ‖W + s B A‖_row                (no dropout)
//   y = x Wᵀ + b + (c − 1) ⊙ x' Wᵀ + c ⊙ s (x' Aᵀ) Bᵀ = x Wᵀ + b + c ⊙ pre − x' Wᵀ,
//       pre = x' Wᵀ + s (x' Aᵀ) Bᵀ,  x' = dropout(x)                                      (dropout)
//   dm += Σ_n dy ⊙ pre / ‖·‖,  and the LoRA / input gradients through dy ⊙ c (dropout: (c − 1) ⊙ dy
//   for the x' Wᵀ term).
// The GEMMs (W + s B A, pre, the gradients) are the decoder's; these are the row and column kernels.
// Shapes: N rows of tokens, `out` columns (the projection's outputs), W (out, in).
// It deliberately does not fuse any of it into the GEMMs.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "kernels/cuda/gemm.h"  // Stream

namespace ktune::cuda {

// w (n) f32 = x (n) bf16 (the base weight widened, before W + s B A is accumulated onto it).
void dora_widen(float* w, const bf16_t* x, int64_t n, Stream stream = nullptr);
// Per row o of w (out, in): norm[o] = ‖w[o, :]‖ (f32), scale[o] = magnitude[o] / norm[o].
void dora_weight_norm(float* norm, float* scale, const float* w, const bf16_t* magnitude, int64_t out, int64_t in,
                      Stream stream = nullptr);
// y (N, out) = beta * y + scale[o] * pre − minus (nullptr: 0) + bias[o] (nullptr: 0), rounded to bf16 once.
void dora_combine(bf16_t* y, const bf16_t* pre, const bf16_t* minus, const float* scale, const bf16_t* bias,
                  float beta, int64_t N, int64_t out, Stream stream = nullptr);
// d (N, out) = dy ⊙ (scale[o] + offset)   (offset 0: dy ⊙ c; −1: dy ⊙ (c − 1)).
void dora_scale_columns(bf16_t* d, const bf16_t* dy, const float* scale, float offset, int64_t N, int64_t out,
                        Stream stream = nullptr);
// dm (out) += Σ_n dy[n, o] pre[n, o] / norm[o]   (f32; the row sums in chunks added atomically).
void dora_magnitude_grad(float* dm, const bf16_t* dy, const bf16_t* pre, const float* norm, int64_t N, int64_t out,
                         Stream stream = nullptr);

}  // namespace ktune::cuda
