// Re-laying an unpacked batch as rows of real tokens. See padding_free.h.
#include "data/padding_free.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "core/error.h"

namespace ktune {

namespace {

constexpr int32_t kPaddingDoc = -1;

// The length of row b's sample: its leading doc-id-0 positions. Checks that the rest is padding
// that carries no label.
int64_t sample_length(const Batch& padded, int64_t b) {
  const int64_t T = padded.seq_len;
  const int32_t* doc = padded.doc_ids.data() + b * T;
  const int32_t* lab = padded.labels.data() + b * T;
  int64_t len = 0;
  while (len < T && doc[len] == 0) ++len;
  for (int64_t t = len; t < T; ++t) {
    if (doc[t] != 0 && lab[t] == kIgnoreIndex) continue;
    const std::string where = "padding-free batch: row " + std::to_string(b) + ", position " + std::to_string(t);
    if (doc[t] == 0) throw Error(where, "sample tokens after its padding (an unpacked batch is right-padded)");
    throw Error(where, "padding labelled " + std::to_string(lab[t]) + " (expected -100; dropping it would drop loss)");
  }
  return len;
}

// First-fit decreasing: the samples of each output row, longest first.
std::vector<std::vector<int64_t>> place_samples(const std::vector<int64_t>& lengths, int64_t max_row_len) {
  std::vector<int64_t> order(lengths.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return lengths[size_t(a)] > lengths[size_t(b)]; });
  std::vector<std::vector<int64_t>> rows;
  std::vector<int64_t> fill;
  for (int64_t s : order) {
    const int64_t len = lengths[size_t(s)];
    if (len == 0) continue;
    size_t r = 0;
    while (r < rows.size() && fill[r] + len > max_row_len) ++r;
    if (r == rows.size()) {
      rows.emplace_back();
      fill.push_back(0);
    }
    rows[r].push_back(s);
    fill[r] += len;
  }
  return rows;
}

}  // namespace

Batch remove_padding(const Batch& padded, int64_t max_row_len) {
  const int64_t B = padded.batch_size, T = padded.seq_len;
  const size_t n = size_t(B * T);
  check(padded.tokens.size() == n && padded.labels.size() == n && padded.positions.size() == n &&
            padded.doc_ids.size() == n,
        "padding-free batch", "tokens, labels, positions and doc_ids must each hold B*T = " + std::to_string(n) + " values");
  std::vector<int64_t> lengths(static_cast<size_t>(B));
  int32_t pad_token = 0;
  for (int64_t b = 0; b < B; ++b) {
    lengths[size_t(b)] = sample_length(padded, b);
    if (lengths[size_t(b)] < T) pad_token = padded.tokens[size_t(b * T + T - 1)];
  }
  const int64_t longest = B > 0 ? *std::max_element(lengths.begin(), lengths.end()) : 0;
  check(max_row_len >= longest, "padding-free batch",
        "max_row_len " + std::to_string(max_row_len) + " cannot hold the longest sample (" + std::to_string(longest) + ")");
  const std::vector<std::vector<int64_t>> rows = place_samples(lengths, max_row_len);

  Batch out;
  out.epoch = padded.epoch;
  out.index = padded.index;
  out.batch_size = std::max<int64_t>(1, int64_t(rows.size()));
  for (const auto& row : rows) {
    int64_t fill = 0;
    for (int64_t s : row) fill += lengths[size_t(s)];
    out.seq_len = std::max(out.seq_len, fill);
  }
  const size_t m = size_t(out.batch_size * out.seq_len);
  out.tokens.assign(m, pad_token);
  out.labels.assign(m, kIgnoreIndex);
  out.positions.assign(m, 0);
  out.doc_ids.assign(m, kPaddingDoc);
  for (size_t r = 0; r < rows.size(); ++r) {
    size_t to = r * size_t(out.seq_len);
    for (int64_t s : rows[r]) {
      const size_t from = size_t(s * T), len = size_t(lengths[size_t(s)]);
      std::copy_n(padded.tokens.begin() + from, len, out.tokens.begin() + to);
      std::copy_n(padded.labels.begin() + from, len, out.labels.begin() + to);
      std::copy_n(padded.positions.begin() + from, len, out.positions.begin() + to);
      std::fill_n(out.doc_ids.begin() + to, len, int32_t(s));
      to += len;
    }
  }
  return out;
}

}  // namespace ktune
