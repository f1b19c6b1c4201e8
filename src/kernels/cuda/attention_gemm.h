// Causal self-attention for training on the tensor cores, through cuBLASLt: per query head, the
// (T, T) scores of every batch row come from strided-batched GEMMs (S = scale Q Kᵀ, f32), a row kernel
// turns them into P = softmax(mask(cap(S))) (bf16) and lse, and O = P V is a second GEMM; the backward
// recomputes S, and runs dV += Pᵀ dO, dP = dO Vᵀ, dS = P (dP - rowsum(dO O)) cap'(S) scale, dQ = dS K,
// dK += dSᵀ Q (dK, dV accumulated in f32 over the heads of a group, then rounded to bf16).
// Same semantics, layouts and lse as kernels/cuda/attention.h (which stays the reference); bf16 only.
// Unlike flash attention it materialises one head's (B, T, T) scores at a time in scratch (f32 S and
// dP, bf16 P: 10 B T^2 bytes, 160 MiB at B=4, T=2048). Its GEMMs skip what causality and the window
// mask wholly: each runs per block of query rows (attention_gemm_block_rows), rows [i0, i1) against
// keys [k0, i1) only, k0 = max(0, i0 - window + 1) rounded down to a multiple of 8 (dK, dV per block
// of keys against the queries that see them): ~62% of the full square's FLOPs with 4 causal blocks.
// The masked entries inside a block are still computed, and zeroed by the row kernels.
// The mask and the cap are kernels/cpu/attention.h's: key j is visible to query i iff j <= i, and
// i - sliding_window < j when sliding_window > 0, and doc_ids[b, j] == doc_ids[b, i] when doc ids
// (packed samples) are given; with softcap > 0 the softmax sees s' = softcap tanh(s / softcap) of the
// scaled score s, and the backward multiplies dS by ds'/ds = 1 - (s' / softcap)^2 (f32, from the
// recomputed S). Both live in the row kernels; documents still cost their full blocks' GEMM work.
// It deliberately does not do f32.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "kernels/cuda/attention.h"  // AttentionShape
#include "kernels/cuda/gemm.h"

namespace ktune::cuda {

// Rows per block of queries the GEMMs run on: T itself up to 128 rows (one block), above that a
// quarter of T rounded up to a multiple of 64, at least 128: at most 4 blocks (4 of 512 at T = 2048),
// the last one partial when they do not divide T.
int64_t attention_gemm_block_rows(int64_t T);

// Bytes of device scratch both directions need (S, dP f32; P bf16; rowsums; f32 dK, dV).
size_t attention_gemm_scratch_bytes(const AttentionShape& s);

// q (B,T,Hq,D)   k, v (B,T,Hkv,D)   out (B,T,Hq,D)   lse (B,Hq,T) saved   doc_ids (B,T) or nullptr (last,
// so that calls without documents read as before).  Throws ktune::Error for heads that do not group,
// or a negative window or soft-cap.
void attention_gemm_forward(GemmContext& ctx, bf16_t* out, float* lse, const bf16_t* q, const bf16_t* k,
                            const bf16_t* v, const AttentionShape& s, void* scratch, Stream stream = nullptr,
                            const int32_t* doc_ids = nullptr);
// Undoes out = softmax(mask(cap(scale q kᵀ))) v: dq (B,T,Hq,D), dk, dv (B,T,Hkv,D) overwritten; doc_ids
// the forward's.
void attention_gemm_backward(GemmContext& ctx, bf16_t* dq, bf16_t* dk, bf16_t* dv, const bf16_t* dout,
                             const bf16_t* q, const bf16_t* k, const bf16_t* v, const bf16_t* out, const float* lse,
                             const AttentionShape& s, void* scratch, Stream stream = nullptr,
                             const int32_t* doc_ids = nullptr);

}  // namespace ktune::cuda
