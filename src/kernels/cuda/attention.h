// Causal self-attention on the GPU for training, with the CPU op's semantics and layouts
// (kernels/cpu/attention.h): grouped-query heads, optional sliding window, optional logit
// soft-capping, optional document ids; a tiled forward with an online softmax that saves lse,
// and a backward that recomputes P from lse (flash-attention 2's algorithm: the (T, T) scores
// never exist). q, k, v, out, dout, dq, dk, dv are f32 or bf16 (one type); lse and the arithmetic f32.
// This first version runs on the CUDA cores (a warp per query row, a lane per key of a tile in
// shared memory), not on tensor cores: correct for every mask, but far from the GPU's bf16 peak.
// Packed rows: without DocumentBounds every key tile up to the diagonal is computed and masked by the
// doc ids; with them, the tiles wholly in other documents are skipped (the same results, bit for bit).
// It deliberately has no dropout, no ALiBi, no KV cache, no non-causal mode; head_dim <= 256.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "kernels/cpu/attention.h"  // AttentionShape (a plain struct; nothing of the CPU code is linked)
#include "kernels/cuda/gemm.h"

namespace ktune::cuda {

using cpu::AttentionShape;

// Where each token's document starts and ends, so that a kernel can skip key tiles that lie wholly in
// other documents (packed rows): device arrays (B, T) each, from the doc ids the kernel is given
// (kernels/cuda/document_bounds.h computes them on the host):
//   first_key[b, i]  = the smallest j with doc_ids[b, j] == doc_ids[b, i]
//   last_query[b, j] = the largest i with doc_ids[b, i] == doc_ids[b, j]
// Both null (the default): every tile up to the diagonal is computed and masked, as without them.
// Bounds wider than these (a smaller first_key, a larger last_query) are exact too, just skip less.
// The doc ids still mask inside the tiles that are computed.
struct DocumentBounds {
  const int32_t* first_key = nullptr;
  const int32_t* last_query = nullptr;
};

// Floats of scratch the backward needs: B * Hq * T (rowsum(dout * out)).
int64_t attention_backward_scratch_floats(const AttentionShape& s);

// q (B,T,Hq,D)   k, v (B,T,Hkv,D)   doc_ids (B,T) or nullptr   out (B,T,Hq,D)   lse (B,Hq,T) saved
// bounds: doc_ids' DocumentBounds, or {} (the overloads without it pass {}).
void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v, const int32_t* doc_ids,
                       DocumentBounds bounds, const AttentionShape& s, Stream stream = nullptr);
void attention_forward(bf16_t* out, float* lse, const bf16_t* q, const bf16_t* k, const bf16_t* v,
                       const int32_t* doc_ids, DocumentBounds bounds, const AttentionShape& s,
                       Stream stream = nullptr);
// Undoes out = softmax(mask(cap(scale q k^T))) v: dq (B,T,Hq,D), dk, dv (B,T,Hkv,D) overwritten.
// scratch: attention_backward_scratch_floats(s) floats. bounds: the forward's.
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                        const float* v, const float* out, const float* lse, const int32_t* doc_ids,
                        DocumentBounds bounds, const AttentionShape& s, float* scratch, Stream stream = nullptr);
void attention_backward(bf16_t* dq, bf16_t* dk, bf16_t* dv, const bf16_t* dout, const bf16_t* q, const bf16_t* k,
                        const bf16_t* v, const bf16_t* out, const float* lse, const int32_t* doc_ids,
                        DocumentBounds bounds, const AttentionShape& s, float* scratch, Stream stream = nullptr);

// The same without bounds (every tile up to the diagonal computed): C++ has no defaulted parameter
// before the shape, so these stand for `bounds = {}`.
template <typename T>
void attention_forward(T* out, float* lse, const T* q, const T* k, const T* v, const int32_t* doc_ids,
                       const AttentionShape& s, Stream stream = nullptr) {
  attention_forward(out, lse, q, k, v, doc_ids, DocumentBounds{}, s, stream);
}
template <typename T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,
                        const float* lse, const int32_t* doc_ids, const AttentionShape& s, float* scratch,
                        Stream stream = nullptr) {
  attention_backward(dq, dk, dv, dout, q, k, v, out, lse, doc_ids, DocumentBounds{}, s, scratch, stream);
}

}  // namespace ktune::cuda
