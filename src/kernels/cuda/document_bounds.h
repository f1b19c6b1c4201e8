// The per-token bounds that let the attention kernels skip key tiles a packed row's documents mask
// wholly (kernels/cuda/attention.h's DocumentBounds), computed on the host from the row's doc ids:
//   first_key[b, i]  = the smallest j with doc_ids[b, j] == doc_ids[b, i]   (no key before it is visible to i)
//   last_query[b, j] = the largest i with doc_ids[b, i] == doc_ids[b, j]    (no query after it sees j)
// They hold for any ids: a document id that recurs further on (not contiguous) only widens them, so a
// kernel that skips by them stays exact. Padding is a document like any other (ktune's id -1).
// Plain host C++ (no CUDA): the caller uploads the two arrays beside the doc ids.
// It deliberately computes nothing on the device: a step's doc ids are host arrays before upload.
#pragma once

#include <cstdint>

namespace ktune::cuda {

// doc_ids (B, T) read; first_key, last_query (B, T) written. O(B * T).
void document_bounds(int32_t* first_key, int32_t* last_query, const int32_t* doc_ids, int64_t B, int64_t T);

}  // namespace ktune::cuda
