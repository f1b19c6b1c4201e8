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
// Packed rows given their HostDocumentBounds start each block's keys at its queries' first document
// start too, and end each key block's queries at its keys' last document end; one strided-batched
// call still covers the B rows, over the union of their ranges (as many calls as without bounds): at
// T = 2048 with 8 documents of 256 tokens in every row, 40% of the causal blocks' FLOPs; rows whose
// documents fall elsewhere save what their earliest start allows. The masked entries inside a block
// are still computed, and zeroed by the row kernels.
// The mask and the cap are kernels/cpu/attention.h's: key j is visible to query i iff j <= i, and
// i - sliding_window < j when sliding_window > 0, and doc_ids[b, j] == doc_ids[b, i] when doc ids
// (packed samples) are given; with softcap > 0 the softmax sees s' = softcap tanh(s / softcap) of the
// scaled score s, and the backward multiplies dS by ds'/ds = 1 - (s' / softcap)^2 (f32, from the
// recomputed S). Both live in the row kernels. It deliberately does not do f32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "kernels/cuda/attention.h"  // AttentionShape
#include "kernels/cuda/gemm.h"

namespace ktune::cuda {

// Rows per block of queries the GEMMs run on: T itself up to 128 rows (one block), above that a
// quarter of T rounded up to a multiple of 64, at least 128: at most 4 blocks (4 of 512 at T = 2048),
// the last one partial when they do not divide T.
int64_t attention_gemm_block_rows(int64_t T);

// A packed batch's document bounds as HOST arrays ((B, T) each): document_bounds.h's first_key and
// last_query of the doc ids the kernels mask by (or wider bounds: smaller first keys, larger last
// queries; narrower ones would let the row kernels read scores no GEMM computed). On the host because
// they choose the GEMMs' shapes. Both null (the default): the blocks of causality and the window alone.
struct HostDocumentBounds {
  const int32_t* first_key = nullptr;
  const int32_t* last_query = nullptr;
};

// What the GEMMs compute of one block of one batch row: as a block of queries [i0, i1), the keys
// [k0, i1); as a block of keys [i0, i1), the queries [i0, q1) (dK, dV).
struct AttentionGemmBlock {
  int64_t i0, i1, k0, q1;
  int64_t rows() const { return i1 - i0; }
  int64_t keys() const { return i1 - k0; }
  int64_t queries() const { return q1 - i0; }
};

// The blocks of one batch row: k0 = max(i0 - window + 1 (window > 0), min first_key[i0:i1], 0)
// rounded down to a multiple of 8, q1 = min(i1 + window - 1 (window > 0), max last_query[i0:i1] + 1
// rounded up to a multiple of 8, T). first_key, last_query: that row's (T) bounds, or both null.
std::vector<AttentionGemmBlock> attention_gemm_blocks(int64_t T, int64_t window, const int32_t* first_key,
                                                      const int32_t* last_query);

// Bytes of device scratch both directions need (S, dP f32; P bf16; rowsums; f32 dK, dV).
size_t attention_gemm_scratch_bytes(const AttentionShape& s);

// q (B,T,Hq,D)   k, v (B,T,Hkv,D)   out (B,T,Hq,D)   lse (B,Hq,T) saved   doc_ids (B,T) or nullptr (last,
// so that calls without documents read as before)   bounds: doc_ids' host bounds, or {} (needs doc_ids).
// Throws ktune::Error for heads that do not group, a negative window or soft-cap, or bounds without doc
// ids or with one array only.
void attention_gemm_forward(GemmContext& ctx, bf16_t* out, float* lse, const bf16_t* q, const bf16_t* k,
                            const bf16_t* v, const AttentionShape& s, void* scratch, Stream stream = nullptr,
                            const int32_t* doc_ids = nullptr, HostDocumentBounds bounds = {});
// Undoes out = softmax(mask(cap(scale q kᵀ))) v: dq (B,T,Hq,D), dk, dv (B,T,Hkv,D) overwritten; doc_ids
// and bounds the forward's.
void attention_gemm_backward(GemmContext& ctx, bf16_t* dq, bf16_t* dk, bf16_t* dv, const bf16_t* dout,
                             const bf16_t* q, const bf16_t* k, const bf16_t* v, const bf16_t* out, const float* lse,
                             const AttentionShape& s, void* scratch, Stream stream = nullptr,
                             const int32_t* doc_ids = nullptr, HostDocumentBounds bounds = {});

}  // namespace ktune::cuda
