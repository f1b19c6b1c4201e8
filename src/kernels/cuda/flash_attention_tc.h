// Causal self-attention for training on the tensor cores, fused (FlashAttention-2's scheme): the
// (T, T) scores never leave the chip. bf16 q, k, v, out and gradients; f32 accumulation, softmax
// and lse. Grouped-query heads; head_dim 64 or 128 only (other sizes are refused: use attention.h).
// Same semantics, layouts, lse (B, Hq, T) = log sum_j exp(cap(scale q_i . k_j)) and backward scratch
// convention as kernels/cuda/attention.h, whose tiled CUDA-core kernel stays the reference: either
// forward's (out, lse) feeds either backward.
// Forward: a block of 4 warps per (b, query head, 128 queries at head_dim 64, 64 at 128), each warp 16
// rows of every 64; key tiles of 64 up to the diagonal only, copied in by cp.async two stages deep; S = Q Kᵀ and O += P V on mma.sync
// m16n8k16 with S, P and O in registers (P rounded to bf16, as flash-attention does); online softmax
// in f32.
// Backward: delta = rowsum(dout * out); a block per (b, kv head, 64 or 128 keys) walks the query
// tiles at or below its keys, for every query head of the group: dV += Pᵀ dO, dK += dSᵀ Q held in
// f32 registers (summed over the group's heads, written once as bf16; S, P and dS stay in registers
// too), dQ += dS K added with f32 (float2) atomics into scratch and rounded to bf16 by a last pass (so dq's summation order is not
// deterministic; dk's and dv's are).
// Masks as attention.h's: key j is visible to query i iff j <= i, i - window < j with a sliding window
// (AttentionShape::sliding_window > 0), and doc_ids[b, j] == doc_ids[b, i] with document ids (packed
// samples; optional, (B, T)). A soft-cap (AttentionShape::softcap > 0) takes the scaled score s to
// cap tanh(s / cap) before the mask, and the lse is of those capped scores; the backward multiplies dS
// by 1 - (s'/cap)^2 from the recomputed capped s'. The forward starts at the key tile of its queries'
// first key in the window and the backward stops after the query tile of the last query its keys'
// window reaches. Without DocumentBounds (attention.h; the last argument) every such tile is still
// computed and masked by the doc ids; with them the forward also starts at the key tile of its
// queries' first document start and the backward stops after the query tile of its keys' last document
// end, skipping the tiles wholly in other documents (the same results, bit for bit; dq up to its
// atomics' order), so a row of many short documents costs about as much as those documents.
// It deliberately has no dropout or f32 path, and none of Hopper's wgmma / TMA: mma.sync, ldmatrix
// and cp.async (sm_80's), plus sm_90's float2 atomicAdd.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "kernels/cuda/attention.h"  // AttentionShape, DocumentBounds
#include "kernels/cuda/gemm.h"       // Stream

namespace ktune::cuda {

// True when this kernel takes the shape: D in {64, 128}, Hq % Hkv == 0 (any window >= 0, soft-cap >= 0).
bool flash_attention_tc_supports(const AttentionShape& s);

// Floats of scratch the backward needs: B * T * Hq * D (dq in f32) + B * Hq * T (delta).
int64_t flash_attention_tc_backward_scratch_floats(const AttentionShape& s);

// q (B,T,Hq,D)   k, v (B,T,Hkv,D)   out (B,T,Hq,D)   lse (B,Hq,T) saved   doc_ids (B,T) or nullptr;
// bounds: doc_ids' DocumentBounds, or {}. q, k, v and out 16-byte aligned. Throws ktune::Error naming the op
// for a shape it does not take.
void flash_attention_tc_forward(bf16_t* out, float* lse, const bf16_t* q, const bf16_t* k, const bf16_t* v,
                                const AttentionShape& s, Stream stream = nullptr, const int32_t* doc_ids = nullptr,
                                DocumentBounds bounds = {});
// Undoes out = softmax(mask(scale q kᵀ)) v: dq (B,T,Hq,D), dk, dv (B,T,Hkv,D) overwritten; doc_ids and
// bounds the forward's. dout, q, k, v, dk, dv and scratch 16-byte aligned; scratch:
// flash_attention_tc_backward_scratch_floats(s) floats.
void flash_attention_tc_backward(bf16_t* dq, bf16_t* dk, bf16_t* dv, const bf16_t* dout, const bf16_t* q,
                                 const bf16_t* k, const bf16_t* v, const bf16_t* out, const float* lse,
                                 const AttentionShape& s, float* scratch, Stream stream = nullptr,
                                 const int32_t* doc_ids = nullptr, DocumentBounds bounds = {});

}  // namespace ktune::cuda
