// Causal self-attention for decoder training, with grouped-query heads (GQA), an optional sliding
// window, optional logit soft-capping (Gemma2) and optional document ids for packed samples.
// The fast version works in tiles of queries x keys with an online softmax (flash-attention 2):
// memory is O(T) per head, the (T, T) scores never exist; the backward recomputes P from lse.
// It deliberately has no dropout, no ALiBi, no KV cache (training only: generation's attention against
// a cache is cached_attention.h), and no non-causal mode.
#pragma once

#include <cstdint>

namespace ktune::cpu {

// Query head h reads kv head h / (Hq / Hkv) (Hq % Hkv == 0).
// Token i sees key j iff j <= i, and i - sliding_window < j when sliding_window > 0 (HF Gemma2's mask),
// and doc_ids[b, i] == doc_ids[b, j] when doc_ids is given.
// Scores s = scale * q.k, then s = softcap * tanh(s / softcap) when softcap > 0, then softmax.
struct AttentionShape {
  int64_t B, T, Hq, Hkv, D;
  float scale;
  int64_t sliding_window = 0;
  float softcap = 0;
};

// q (B,T,Hq,D)   k, v (B,T,Hkv,D)   doc_ids (B,T) or nullptr   out (B,T,Hq,D)   lse (B,Hq,T) saved
void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const int32_t* doc_ids, const AttentionShape& s);
// Undoes out = softmax(mask(cap(scale q k^T))) v: dq (B,T,Hq,D), dk, dv (B,T,Hkv,D) overwritten.
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                        const float* v, const float* out, const float* lse, const int32_t* doc_ids,
                        const AttentionShape& s);

// Plain versions that build the full (T, T) score matrix per head, in double.
void attention_forward_reference(float* out, float* lse, const float* q, const float* k, const float* v,
                                 const int32_t* doc_ids, const AttentionShape& s);
void attention_backward_reference(float* dq, float* dk, float* dv, const float* dout, const float* q,
                                  const float* k, const float* v, const float* out, const float* lse,
                                  const int32_t* doc_ids, const AttentionShape& s);

}  // namespace ktune::cpu
