// The output projection fused with cross-entropy on the GPU, in chunks of tokens, so that the
// (N, V) logits never exist in full (kernels/cpu/cross_entropy.h's conventions and result). Per
// chunk: logits f32 = hidden @ W^T (cuBLASLt, bf16 inputs), optional final-logit soft-cap, a block
// per row computes lse, the loss and the gradient dlogits (rounded to bf16 for the two backward
// GEMMs), then dhidden = dlogits @ W and dW += dlogits^T @ hidden.
// The head may carry LoRA (LoraHead: LoRA on lm_head): per chunk the logits take s · xa Bᵀ on top
// (xa = dropout(hidden) Aᵀ, (N, r), computed once by the caller), and the backward gives
// dxa = s · dlogits B and dB += s · dlogitsᵀ xa; the caller finishes through xa = x' Aᵀ
// (dA += dxaᵀ x', dhidden += dxa A), as the CPU LoraAdapter::fused_output_cross_entropy does.
// Peak scratch: chunk_tokens * V * 6 bytes (f32 logits + bf16 dlogits), flat in N.
// It deliberately does not average (returns the sum and the count; the caller scales through
// grad_scale), and it synchronises once at the end to return the loss (a device-side total for a
// fully asynchronous step is left to the recipe integration).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "kernels/cuda/gemm.h"

namespace ktune::cuda {

constexpr int32_t kIgnoreIndex = -100;

// Bytes of device scratch for chunks of chunk_tokens tokens (logits, dlogits, per-row losses).
size_t linear_cross_entropy_scratch_bytes(int64_t chunk_tokens, int64_t V);

// LoRA on the head: logits = hidden Wᵀ + scale · xa Bᵀ. rank 0: none.
struct LoraHead {
  int64_t rank = 0;
  float scale = 0;             // s = alpha / r
  const bf16_t* b = nullptr;   // (V, rank) bf16
  const bf16_t* xa = nullptr;  // (N, rank) bf16, rows as hidden's: dropout(hidden) Aᵀ
  bf16_t* dxa = nullptr;       // (N, rank) bf16 or nullptr: overwritten with scale · dlogits B (grad_scale
                               // included, 0 on ignored rows)
  float* db = nullptr;         // (V, rank) f32 or nullptr: += scale · dlogitsᵀ xa
};

// hidden (N, C) bf16   weight (V, C) bf16   labels (N) i32, -100 ignored   softcap: 0 = off
// Returns sum over valid tokens of CE(logits_i, labels_i); *n_valid = their count (may be nullptr).
// dhidden (N, C) f32 or nullptr: overwritten with grad_scale * d(sum)/d(hidden) (0 on ignored rows).
// dweight (V, C) f32 or nullptr: += grad_scale * d(sum)/d(weight).
// Throws ktune::Error naming the first row whose label is outside [0, V) and not -100.
double linear_cross_entropy(GemmContext& ctx, float* dhidden, float* dweight, int64_t* n_valid, const bf16_t* hidden,
                            const bf16_t* weight, const int32_t* labels, int64_t N, int64_t C, int64_t V,
                            float softcap, float grad_scale, int64_t chunk_tokens, void* scratch,
                            Stream stream = nullptr);
// The same with LoRA on the head (lora.rank > 0; dweight, when given, is still the base W's).
double linear_cross_entropy(GemmContext& ctx, float* dhidden, float* dweight, int64_t* n_valid, const bf16_t* hidden,
                            const bf16_t* weight, const LoraHead& lora, const int32_t* labels, int64_t N, int64_t C,
                            int64_t V, float softcap, float grad_scale, int64_t chunk_tokens, void* scratch,
                            Stream stream = nullptr);

}  // namespace ktune::cuda
