// The output projection fused with cross-entropy, in chunks of tokens, so that the (N, V) logits
// never exist in full (peak memory is chunk_tokens * V floats, flat in N). Per chunk: logits =
// hidden @ W^T (gemm), optional final-logit soft-cap, log-softmax, the gradient in place, then
// dhidden = dlogits @ W and dW += dlogits^T @ hidden (gemm). A chunk gathers up to chunk_tokens tokens
// with valid labels from anywhere in the batch, so ignored tokens (label -100) cost no GEMM at all and
// a prompt-masked batch's short answer runs share tall GEMMs (one read of W per chunk, not per run);
// the labelled tokens are split evenly into as few chunks as chunk_tokens allows (no short last chunk).
// The head may carry an adapter (OutputHead, for LoRA/DoRA/QLoRA on lm_head: model/adapters/
// lora_adapter.h): a low-rank term s · xa Bᵀ added per chunk (xa = dropout(hidden) Aᵀ, computed once
// by the caller), an NF4 base weight dequantised a block of vocabulary rows at a time (kernels/cpu/
// nf4.h, never whole), and DoRA's per-vocabulary-row scale c = m / ‖W + sBA‖ (the norm detached).
// A bf16 head (dtype=bf16 storage, no adapter) has its own entry, linear_cross_entropy_bf16, whose
// GEMMs take the bf16 weight itself.
// It deliberately does not average: it returns the sum and the count, and the caller divides
// (through grad_scale) the way its recipe normalises (per batch, per accumulation window, per rank).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "kernels/cpu/nf4.h"

namespace ktune::cpu {

constexpr int32_t kIgnoreIndex = -100;

// The output projection z (rows, V) of hidden rows h (rows, C):
//   z = h Wᵀ + s · xa Bᵀ          (LoRA; rank 0: no low-rank term)
//   z = c ⊙ (h Wᵀ + s · xa Bᵀ)    (DoRA, c per vocabulary row)
//   z = h Wᵀ + c ⊙ (h' Wᵀ + s · xa Bᵀ) − h' Wᵀ   (DoRA with dropout, as PEFT: h' the dropped rows)
// W f32 (weight), or NF4 (nf4_codes, nf4_scales) when weight is nullptr.
struct OutputHead {
  const float* weight = nullptr;        // (V, C)
  const uint8_t* nf4_codes = nullptr;   // (V*C/2)
  const Nf4Scales* nf4_scales = nullptr;  // (V*C/64 blocks)
  Nf4Arithmetic nf4_arithmetic = Nf4Arithmetic::kBf16;
  int64_t rank = 0;
  const float* lora_b = nullptr;        // (V, rank)
  float lora_scale = 0.0f;              // s
  const float* xa = nullptr;            // (N, rank) rows as hidden's
  float* dxa = nullptr;                 // (N, rank) or nullptr: overwritten, grad_scale · d(sum)/d(xa), 0 on ignored rows
  float* dlora_b = nullptr;             // (V, rank) or nullptr: += grad_scale · d(sum)/d(B)
  bool dora = false;
  const float* dora_scale = nullptr;    // (V) c = m / ‖W + sBA‖
  const float* weight_norm = nullptr;   // (V) ‖W + sBA‖
  float* dmagnitude = nullptr;          // (V) or nullptr: += grad_scale · d(sum)/d(m)
  const float* dropped_hidden = nullptr;  // (N, C) h' (DoRA with dropout), or nullptr: h' = h
  float* ddropped_hidden = nullptr;       // (N, C) or nullptr: overwritten, d(sum)/d(h') through the base
                                          // terms, ((c − 1) ⊙ dz) W (the low-rank path is dxa's); 0 on ignored rows
};

// Floats of scratch linear_cross_entropy needs for chunks of chunk_tokens tokens:
// chunk_tokens * V (logits) + 2 * chunk_tokens * C (the gathered hidden rows and their gradient).
size_t linear_cross_entropy_scratch_floats(int64_t chunk_tokens, int64_t V, int64_t C);
// With an OutputHead (only its rank, nf4_codes and dora matter here): + 2 * chunk_tokens * rank (xa
// and dxa rows), + chunk_tokens * (V + C) (DoRA: the unscaled z, the dropped rows), + an NF4 block of rows.
size_t linear_cross_entropy_scratch_floats(int64_t chunk_tokens, int64_t V, int64_t C, const OutputHead& head);

// hidden (N, C)   weight (V, C)   labels (N), -100 ignored   softcap: 0 = off
// Returns sum over valid tokens of CE(logits_i, labels_i); *n_valid = their count (n_valid may be nullptr).
// dhidden (N, C) or nullptr: overwritten with grad_scale * d(sum)/d(hidden) (0 on ignored rows).
// dweight (V, C) or nullptr: += grad_scale * d(sum)/d(weight).
// Throws ktune::Error for a label outside [0, V) other than -100.
double linear_cross_entropy(float* dhidden, float* dweight, int64_t* n_valid, const float* hidden,
                            const float* weight, const int32_t* labels, int64_t N, int64_t C, int64_t V,
                            float softcap, float grad_scale, int64_t chunk_tokens, float* scratch);

// The same with an adapted head (see OutputHead). dweight must be nullptr for an NF4 head.
double linear_cross_entropy(float* dhidden, float* dweight, int64_t* n_valid, const float* hidden,
                            const OutputHead& head, const int32_t* labels, int64_t N, int64_t C, int64_t V,
                            float softcap, float grad_scale, int64_t chunk_tokens, float* scratch);

// A bf16 head multiplied as bf16 (gemm_bf16): weight (V, C) bf16. Per chunk the gathered hidden
// rows and the logits' gradient are rounded to bf16 for the GEMMs (f32 accumulation; logits, loss and
// dhidden f32), so no f32 copy of W exists. The weight gradient (at most one of the two, or neither):
// dweight (V, C) f32 +=; or dweight_bf16 (V, C) bf16 +=, summed in f32 a block of vocabulary rows at a
// time and rounded once per block and chunk (linear_backward_weight_bf16_blocks: no (V, C) f32 buffer either).
// chunk_tokens * V (logits) + the same in bf16 (dlogits) + chunk_tokens * C in bf16 (hidden rows)
// + chunk_tokens * C (dhidden rows) + one dW block.
size_t linear_cross_entropy_bf16_scratch_floats(int64_t chunk_tokens, int64_t V, int64_t C);
double linear_cross_entropy_bf16(float* dhidden, float* dweight, bf16_t* dweight_bf16, int64_t* n_valid,
                                 const float* hidden, const bf16_t* weight, const int32_t* labels, int64_t N,
                                 int64_t C, int64_t V, float softcap, float grad_scale, int64_t chunk_tokens,
                                 float* scratch);

// Materialises all (N, V) logits, in double: what the tests compare against.
double linear_cross_entropy_reference(float* dhidden, float* dweight, int64_t* n_valid, const float* hidden,
                                      const float* weight, const int32_t* labels, int64_t N, int64_t C, int64_t V,
                                      float softcap, float grad_scale);

}  // namespace ktune::cpu
