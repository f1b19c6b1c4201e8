// Device side of DocumentBounds (kernels/cuda/attention.h): the key range a block of query rows can
// see, and the query range a block of keys can reach, for the attention kernels' tile loops.
// Every thread of a block reads the block's rows itself (the same addresses in every lane: broadcast
// loads, at most a tile's worth), so the result is uniform over the block with no barrier or shuffle.
// Included by .cu files only. It deliberately masks nothing: the kernels' doc id tests still do.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ktune::cuda {

// The smallest first_key[b, i] over rows i in [first, first + count) with i < T: no row of the block
// sees a key before it. first_key (B, T); first < T.
__device__ __forceinline__ int64_t block_first_key(const int32_t* first_key, int64_t b, int64_t T, int64_t first,
                                                   int64_t count) {
  int64_t lo = first;  // row `first` itself is in the block (and first_key[b, first] <= first)
  for (int64_t i = first; i < first + count && i < T; ++i) lo = min(lo, int64_t(first_key[b * T + i]));
  return max(lo, int64_t(0));
}

// The largest last_query[b, j] over keys j in [first, first + count) with j < T: no query after it
// sees a key of the block. last_query (B, T); first < T.
__device__ __forceinline__ int64_t block_last_query(const int32_t* last_query, int64_t b, int64_t T, int64_t first,
                                                    int64_t count) {
  int64_t hi = min(first + count, T) - 1;  // the block's last key sees itself (last_query[b, j] >= j)
  for (int64_t j = first; j < first + count && j < T; ++j) hi = max(hi, int64_t(last_query[b * T + j]));
  return min(hi, T - 1);
}

}  // namespace ktune::cuda
