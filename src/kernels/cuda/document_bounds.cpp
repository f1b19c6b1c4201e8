// document_bounds.h: one pass forward (each id's first position) and one backward (its last) per row.
#include "kernels/cuda/document_bounds.h"

#include <unordered_map>

#include "core/error.h"

namespace ktune::cuda {

void document_bounds(int32_t* first_key, int32_t* last_query, const int32_t* doc_ids, int64_t B, int64_t T) {
  check(B >= 0 && T >= 0 && T <= INT32_MAX, "document_bounds", "B >= 0 and 0 <= T <= INT32_MAX needed");
  std::unordered_map<int32_t, int32_t> seen;  // id -> its first (forward pass) or last (backward pass) position
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* docs = doc_ids + b * T;
    seen.clear();
    for (int64_t i = 0; i < T; ++i) first_key[b * T + i] = seen.try_emplace(docs[i], int32_t(i)).first->second;
    seen.clear();
    for (int64_t j = T - 1; j >= 0; --j) last_query[b * T + j] = seen.try_emplace(docs[j], int32_t(j)).first->second;
  }
}

}  // namespace ktune::cuda
