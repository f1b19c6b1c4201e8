// The output projection fused with cross-entropy on the GPU, in chunks of tokens, so that the
// (N, V) logits never exist in full (kernels/cpu/cross_entropy.h's conventions and result). Per
// chunk: logits f32 = hidden @ W^T (cuBLASLt, bf16 inputs), optional final-logit soft-cap, a block
// per row computes lse, the loss and the gradient dlogits (rounded to bf16 for the two backward
// GEMMs), then dhidden = dlogits @ W and dW += dlogits^T @ hidden.
// The head may carry LoRA (LoraHead: LoRA on lm_head): per chunk the logits take s · xa Bᵀ on top
// (xa = dropout(hidden) Aᵀ, (N, r), computed once by the caller), and the backward gives
// dxa = s · dlogits B and dB += s · dlogitsᵀ xa; the caller finishes through xa = x' Aᵀ
// (dA += dxaᵀ x', dhidden += dxa A), as the CPU LoraAdapter::fused_output_cross_entropy does.
// DoRA on the head (the CPU OutputHead's math, the norm detached): logits = c ⊙ (h Wᵀ + s xa Bᵀ), c per
// vocabulary row (m / ‖W + sBA‖, computed by the caller); with dropout (PEFT's variant)
// logits = h Wᵀ − h' Wᵀ + c ⊙ (h' Wᵀ + s xa Bᵀ), h' the dropped rows.
// QLoRA: W as NF4, dequantised a block of vocabulary rows at a time into the caller's block scratch
// before each GEMM that reads it (the forward's and the backward's, in every chunk), never whole.
// Peak scratch: chunk_tokens * V * 6 bytes (f32 logits + bf16 dlogits), flat in N; DoRA with
// dropout another chunk_tokens * V * 4 (h Wᵀ − h' Wᵀ, then ((c − 1) ⊙ dz) in bf16).
// It deliberately does not average (returns the sum and the count; the caller scales through
// grad_scale). linear_cross_entropy synchronises once at the end to return the loss; a step that
// should not wait enqueues with linear_cross_entropy_enqueue (the sum, the count and a bad label's row
// stay on the device, in a buffer of the caller's) and reads them with linear_cross_entropy_totals once it has
// enqueued the rest (the decoder's backward), so the host runs ahead of the device through the loss.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "kernels/cuda/gemm.h"

namespace ktune::cuda {

constexpr int32_t kIgnoreIndex = -100;

// Bytes of device scratch for chunks of chunk_tokens tokens (logits, dlogits, per-row losses).
// dropped_hidden: for a head with LoraHead::dropped_hidden (DoRA with dropout), chunk_tokens * V * 4 more.
size_t linear_cross_entropy_scratch_bytes(int64_t chunk_tokens, int64_t V, bool dropped_hidden = false);

// LoRA on the head: logits = hidden Wᵀ + scale · xa Bᵀ. rank 0: none.
struct LoraHead {
  int64_t rank = 0;
  float scale = 0;             // s = alpha / r
  const bf16_t* b = nullptr;   // (V, rank) bf16
  const bf16_t* xa = nullptr;  // (N, rank) bf16, rows as hidden's: dropout(hidden) Aᵀ
  bf16_t* dxa = nullptr;       // (N, rank) bf16 or nullptr: overwritten with scale · dlogits B (grad_scale
                               // included, 0 on ignored rows)
  float* db = nullptr;         // (V, rank) f32 or nullptr: += scale · dlogitsᵀ xa
  // DoRA (dora_scale set): logits = c ⊙ (h Wᵀ + s xa Bᵀ), or with dropped_hidden
  // h Wᵀ − h' Wᵀ + c ⊙ (h' Wᵀ + s xa Bᵀ); the LoRA gradients above then go through dlogits ⊙ c.
  const float* dora_scale = nullptr;       // (V) c = m / ‖W + s B A‖_row, or nullptr: no DoRA
  const float* weight_norm = nullptr;      // (V) ‖W + s B A‖_row
  float* dmagnitude = nullptr;             // (V) f32 or nullptr: += Σ_rows dlogits ⊙ (h' Wᵀ + s xa Bᵀ) / norm
  const bf16_t* dropped_hidden = nullptr;  // (N, C) h' (DoRA with dropout) or nullptr: h' = h
  float* ddropped_hidden = nullptr;        // (N, C) f32 or nullptr: overwritten with ((c − 1) ⊙ dlogits) W, the
                                           // gradient of h' through the base terms (dxa's is the caller's)
  // QLoRA (weight == nullptr): W (V, C) as NF4 codes (V*C/2) and scales (V*C/64), dequantised
  // nf4_block_rows vocabulary rows at a time into nf4_block ((nf4_block_rows, C) bf16;
  // nf4_block_rows * C a multiple of 64).
  const uint8_t* nf4_codes = nullptr;
  const bf16_t* nf4_scales = nullptr;
  int64_t nf4_block_rows = 0;
  bf16_t* nf4_block = nullptr;
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
// The same with LoRA on the head (lora.rank > 0; dweight, when given, is still the base W's; weight
// nullptr: the NF4 W of lora, frozen, no dweight).
double linear_cross_entropy(GemmContext& ctx, float* dhidden, float* dweight, int64_t* n_valid, const bf16_t* hidden,
                            const bf16_t* weight, const LoraHead& lora, const int32_t* labels, int64_t N, int64_t C,
                            int64_t V, float softcap, float grad_scale, int64_t chunk_tokens, void* scratch,
                            Stream stream = nullptr);

// The same work, enqueued only: nothing waits. The loss's sum, its count and the first bad label's
// row go to `totals` (device, linear_cross_entropy_totals_bytes(); apart from the scratch, which the
// caller may reuse as soon as the pass has run), for linear_cross_entropy_totals to read.
void linear_cross_entropy_enqueue(GemmContext& ctx, float* dhidden, float* dweight, const bf16_t* hidden,
                                  const bf16_t* weight, const LoraHead& lora, const int32_t* labels, int64_t N,
                                  int64_t C, int64_t V, float softcap, float grad_scale, int64_t chunk_tokens,
                                  void* scratch, void* totals, Stream stream = nullptr);
size_t linear_cross_entropy_totals_bytes();

// What an enqueued linear_cross_entropy summed: the loss over the valid tokens and their count.
struct CrossEntropyTotals {
  double loss_sum = 0;
  int64_t n_valid = 0;
};

// Waits for `stream` and reads the totals an enqueued pass left in `totals`; throws ktune::Error
// naming the first row whose label is outside [0, V) and not -100, as linear_cross_entropy does.
CrossEntropyTotals linear_cross_entropy_totals(const void* totals, int64_t V, Stream stream = nullptr);

}  // namespace ktune::cuda
