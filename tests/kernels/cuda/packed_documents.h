// What the attention kernels' packed-batch tests share (attention_test.cpp, flash_attention_tc_test.cpp):
// a doc id layout of short documents, its DocumentBounds on the device, and a bit-for-bit comparison.
// short_documents(B, T), row b by b % 3:
//   0: documents of 37, 90, 5, 70, 23, 1, 45, .. tokens (not multiples of the 32- or 64-tiles, some
//      longer than a tile; the cycle starts b / 3 places in), then the row's padding (id -1, the last
//      T / 8 + b tokens);
//   1: one document (no padding);
//   2: ids 5 and 6 in runs of 45, 80, 30, 60 (each id recurs after the other: not contiguous), then padding.
// It deliberately holds no expectation: each test file checks its own kernels.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_test_harness.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/document_bounds.h"

namespace ktune::cuda_test {

inline std::vector<int32_t> short_documents(int64_t B, int64_t T) {
  static const int64_t kLengths[] = {37, 90, 5, 70, 23, 1, 45};
  static const int64_t kRuns[] = {45, 80, 30, 60};
  std::vector<int32_t> ids;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t padding_from = T - T / 8 - b;
    int64_t doc = 0, next_start = 0, n = b / 3;
    for (int64_t i = 0; i < T; ++i) {
      if (b % 3 == 1) {
        ids.push_back(4);
        continue;
      }
      if (i == next_start) {  // a new document (row 0) or run (row 2) starts here
        doc = b % 3 == 0 ? n : 5 + n % 2;
        next_start += b % 3 == 0 ? kLengths[n % 7] : kRuns[n % 4];
        ++n;
      }
      ids.push_back(i >= padding_from ? -1 : int32_t(doc));
    }
  }
  return ids;
}

// DocumentBounds of doc ids (B, T) (kernels/cuda/document_bounds.h), uploaded.
struct DeviceDocumentBounds {
  cuda::DeviceBuffer first_key, last_query;
  cuda::DocumentBounds view() const { return {first_key.as<int32_t>(), last_query.as<int32_t>()}; }
};
inline DeviceDocumentBounds device_document_bounds(const std::vector<int32_t>& docs, int64_t B, int64_t T) {
  std::vector<int32_t> first_key(docs.size()), last_query(docs.size());
  cuda::document_bounds(first_key.data(), last_query.data(), docs.data(), B, T);
  return {to_device(first_key), to_device(last_query)};
}

// got and want hold the same bits (NaN included), element for element.
inline void check_identical(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  if (got.size() != want.size()) {
    CHECK(got.size() == want.size()) << what << ": " << got.size() << " values, want " << want.size();
    return;
  }
  size_t differ = 0, first = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0 && differ++ == 0) first = i;
  CHECK(differ == 0) << what << ": " << differ << " of " << want.size() << " differ, the first at " << first << " ("
                     << (differ ? got[first] : 0.0f) << " vs " << (differ ? want[first] : 0.0f) << ")";
}

}  // namespace ktune::cuda_test
