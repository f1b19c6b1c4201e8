// Attention for generation: the queries of a few new tokens against a key/value cache that holds
// every earlier token's keys and values and, last, the new tokens' own (model/kv_cache.h). The masks
// are attention_forward's (causal, sliding window, soft-capping, GQA); there is one sequence, so no
// document ids, and nothing is saved for a backward (generation has none).
// The new tokens are the last n of the cache: new token i sits at position past + i, where
// past = length - n, and sees key j iff j <= past + i and past + i - sliding_window < j.
#pragma once

#include <cstdint>

namespace ktune::cpu {

struct CachedAttentionShape {
  int64_t n;       // new tokens (queries)
  int64_t length;  // keys in the cache, the new tokens' included (length >= n)
  int64_t Hq, Hkv, D;
  float scale;
  int64_t sliding_window = 0;
  float softcap = 0;
};

// q (n, Hq, D)   k, v (length, Hkv, D)   out (n, Hq, D)
void cached_attention_forward(float* out, const float* q, const float* k, const float* v, const CachedAttentionShape& s);

}  // namespace ktune::cpu
