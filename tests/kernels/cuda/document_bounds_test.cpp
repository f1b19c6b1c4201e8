// The host computation of DocumentBounds (kernels/cuda/document_bounds.h) against a brute-force
// O(T^2) reference written from the definition: first_key[b, i] = the smallest j with the same id as
// i, last_query[b, j] = the largest i with the same id as j. Layouts: a packed row with ktune's padding
// document (-1) at the end, ids that recur further on (not contiguous), one document, every token its
// own document, one token, and random ids from a small set (negative ones too).
// Host code only: it runs on the emulator's binary, and in the GPU binary only where a GPU is found.
#include <algorithm>
#include <random>
#include <vector>

#include "cuda_test_harness.h"
#include "kernels/cuda/document_bounds.h"

namespace ktune {
namespace {

void check_document_bounds(const char* name, const std::vector<int32_t>& docs, int64_t B, int64_t T) {
  std::vector<int32_t> first_key(size_t(B * T), -7), last_query(size_t(B * T), -7);
  cuda::document_bounds(first_key.data(), last_query.data(), docs.data(), B, T);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < T; ++i) {
      int64_t first = T, last = -1;
      for (int64_t j = 0; j < T; ++j)
        if (docs[size_t(b * T + j)] == docs[size_t(b * T + i)]) first = std::min(first, j), last = std::max(last, j);
      CHECK(first_key[size_t(b * T + i)] == first) << name << " first_key[" << b << ", " << i << "] = "
                                                   << first_key[size_t(b * T + i)] << ", want " << first;
      CHECK(last_query[size_t(b * T + i)] == last) << name << " last_query[" << b << ", " << i << "] = "
                                                   << last_query[size_t(b * T + i)] << ", want " << last;
    }
}

KTUNE_CUDA_TEST(DocumentBoundsMatchBruteForce) {
  // Row 0 packed (lengths 1, 37, 90, 5, then padding -1), row 1 ids 3 and 4 alternating in runs
  // (3 recurs after 4), row 2 one document.
  const int64_t T = 150;
  std::vector<int32_t> docs;
  for (int64_t i = 0; i < T; ++i) docs.push_back(i < 1 ? 0 : i < 38 ? 1 : i < 128 ? 2 : i < 133 ? 3 : -1);
  for (int64_t i = 0; i < T; ++i) docs.push_back((i / 40) % 2 == 0 ? 3 : 4);
  for (int64_t i = 0; i < T; ++i) docs.push_back(9);
  check_document_bounds("packed / recurring / one document", docs, 3, T);

  std::vector<int32_t> distinct;
  for (int64_t i = 0; i < 70; ++i) distinct.push_back(int32_t(1000 - i));
  check_document_bounds("every token its own document", distinct, 1, 70);
  check_document_bounds("one token", {-1}, 1, 1);

  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> id(-2, 3);
  std::vector<int32_t> random(4 * 97);
  for (auto& x : random) x = id(rng);
  check_document_bounds("random ids", random, 4, 97);
}

}  // namespace
}  // namespace ktune
