// remove_padding(): an unpacked batch re-laid as rows of its samples' real tokens — one row when
// the row length allows (lengths, positions restarting per sample, the padded row index as
// document id, labels shifted per row before (no sample's last token labelled with the next one's
// first)), rows of at most T (first-fit decreasing, their tails padding), batches with nothing to
// remove, B = 1, empty samples, the loader's own batches, and the refusals.
#include <gtest/gtest.h>

#include <map>

#include "core/error.h"
#include "data/data_loader.h"
#include "data/padding_free.h"

namespace ktune {
namespace {

constexpr int32_t kPad = 0;
constexpr int64_t kOneRow = 1 << 30;  // a max_row_len that holds any batch in one row

// A right-padded (B, T) batch as the unpacked collation makes it: each sample's tokens and
// labels (unshifted, -100 where untrained), positions 0..T-1, doc ids 0 / 1 (padding).
Batch padded_batch(const std::vector<std::vector<int32_t>>& samples, const std::vector<std::vector<int32_t>>& labels) {
  Batch b;
  b.batch_size = int64_t(samples.size());
  for (const auto& s : samples) b.seq_len = std::max(b.seq_len, int64_t(s.size()));
  b.epoch = 2;
  b.index = 5;
  for (size_t r = 0; r < samples.size(); ++r)
    for (int64_t t = 0; t < b.seq_len; ++t) {
      const bool real = t < int64_t(samples[r].size());
      b.tokens.push_back(real ? samples[r][size_t(t)] : kPad);
      b.labels.push_back(real ? labels[r][size_t(t)] : kIgnoreIndex);
      b.positions.push_back(int32_t(t));
      b.doc_ids.push_back(real ? 0 : 1);
    }
  return b;
}

TEST(PaddingFree, OneRowHoldsEverySampleLongestFirstWithRestartingPositionsAndRowDocIds) {
  // Lengths 4, 2, 3 padded to T = 4: 12 positions, 9 real.
  Batch padded = padded_batch({{11, 12, 13, 14}, {21, 22}, {31, 32, 33}},
                              {{-100, 12, 13, 14}, {21, 22}, {-100, -100, 33}});
  shift_labels(padded);
  const Batch flat = remove_padding(padded, kOneRow);
  EXPECT_EQ(flat.batch_size, 1);
  EXPECT_EQ(flat.seq_len, 9);
  EXPECT_EQ(flat.epoch, 2);
  EXPECT_EQ(flat.index, 5);
  EXPECT_EQ(flat.tokens, (std::vector<int32_t>{11, 12, 13, 14, 31, 32, 33, 21, 22}));
  // Shifted per row: each sample's last token is -100, not the next sample's first token.
  EXPECT_EQ(flat.labels, (std::vector<int32_t>{12, 13, 14, -100, -100, 33, -100, 22, -100}));
  EXPECT_EQ(flat.positions, (std::vector<int32_t>{0, 1, 2, 3, 0, 1, 2, 0, 1}));
  EXPECT_EQ(flat.doc_ids, (std::vector<int32_t>{0, 0, 0, 0, 2, 2, 2, 1, 1}));
  EXPECT_EQ(flat.num_label_tokens(), padded.num_label_tokens());
}

TEST(PaddingFree, RowsOfAtMostTFillFirstFitLongestFirst) {
  // Lengths 6, 1, 2, 3 at T = 6: rows {6} and {3, 2, 1}; 12 positions instead of 24.
  Batch padded = padded_batch({{1, 2, 3, 4, 5, 6}, {7}, {8, 9}, {10, 11, 12}},
                              {{1, 2, 3, 4, 5, 6}, {7}, {8, 9}, {10, 11, 12}});
  shift_labels(padded);
  const Batch rows = remove_padding(padded, padded.seq_len);
  EXPECT_EQ(rows.batch_size, 2);
  EXPECT_EQ(rows.seq_len, 6);
  EXPECT_EQ(rows.tokens, (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 10, 11, 12, 8, 9, 7}));
  EXPECT_EQ(rows.labels, (std::vector<int32_t>{2, 3, 4, 5, 6, -100, 11, 12, -100, 9, -100, -100}));
  EXPECT_EQ(rows.positions, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 0, 1, 2, 0, 1, 0}));
  EXPECT_EQ(rows.doc_ids, (std::vector<int32_t>{0, 0, 0, 0, 0, 0, 3, 3, 3, 2, 2, 1}));
}

TEST(PaddingFree, RowTailsAreUnlabelledPaddingOfTheirOwnDocument) {
  // Lengths 4, 3, 2 at T = 4: no two share a row; rows 1 and 2 end in padding.
  Batch padded = padded_batch({{1, 2, 3, 4}, {5, 6, 7}, {8, 9}}, {{1, 2, 3, 4}, {5, 6, 7}, {8, 9}});
  shift_labels(padded);
  const Batch rows = remove_padding(padded, padded.seq_len);
  EXPECT_EQ(rows.batch_size, 3);
  EXPECT_EQ(rows.seq_len, 4);
  EXPECT_EQ(rows.tokens, (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, kPad, 8, 9, kPad, kPad}));
  EXPECT_EQ(rows.labels, (std::vector<int32_t>{2, 3, 4, -100, 6, 7, -100, -100, 9, -100, -100, -100}));
  EXPECT_EQ(rows.positions, (std::vector<int32_t>{0, 1, 2, 3, 0, 1, 2, 0, 0, 1, 0, 0}));
  EXPECT_EQ(rows.doc_ids, (std::vector<int32_t>{0, 0, 0, 0, 1, 1, 1, -1, 2, 2, -1, -1}));
}

TEST(PaddingFree, ABatchWithoutPaddingKeepsEveryPosition) {
  Batch padded = padded_batch({{1, 2, 3}, {4, 5, 6}}, {{1, 2, 3}, {4, 5, 6}});
  shift_labels(padded);
  const Batch same = remove_padding(padded, padded.seq_len);
  EXPECT_EQ(same.batch_size, 2);
  EXPECT_EQ(same.tokens, padded.tokens);
  EXPECT_EQ(same.labels, padded.labels);
  EXPECT_EQ(same.positions, padded.positions);
  EXPECT_EQ(same.doc_ids, (std::vector<int32_t>{0, 0, 0, 1, 1, 1}));
  const Batch flat = remove_padding(padded, kOneRow);
  EXPECT_EQ(flat.batch_size, 1);
  EXPECT_EQ(flat.seq_len, 6);
  EXPECT_EQ(flat.tokens, padded.tokens);
  EXPECT_EQ(flat.labels, padded.labels);
}

TEST(PaddingFree, OneRowIsItself) {
  Batch padded = padded_batch({{7, 8, 9, 10}}, {{-100, 8, 9, 10}});
  shift_labels(padded);
  for (int64_t max_row_len : {int64_t(4), kOneRow}) {
    const Batch flat = remove_padding(padded, max_row_len);
    EXPECT_EQ(flat.batch_size, 1);
    EXPECT_EQ(flat.seq_len, 4);
    EXPECT_EQ(flat.tokens, padded.tokens);
    EXPECT_EQ(flat.labels, padded.labels);
    EXPECT_EQ(flat.positions, padded.positions);
    EXPECT_EQ(flat.doc_ids, padded.doc_ids);
  }
}

TEST(PaddingFree, AnEmptySampleTakesNoPlace) {
  Batch padded = padded_batch({{1, 2}, {}, {3}}, {{1, 2}, {}, {3}});
  shift_labels(padded);
  const Batch flat = remove_padding(padded, kOneRow);
  EXPECT_EQ(flat.tokens, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(flat.labels, (std::vector<int32_t>{2, -100, -100}));
  EXPECT_EQ(flat.positions, (std::vector<int32_t>{0, 1, 0}));
  EXPECT_EQ(flat.doc_ids, (std::vector<int32_t>{0, 0, 2}));
}

// The loader's own unpacked batches, in one row and in rows of at most T: every sample comes back
// whole, once, with its padded row's labels and positions 0..L-1; rows are no more and no longer
// than the padded batch's; what is left is unlabelled padding.
TEST(PaddingFree, LoaderBatchesKeepEverySampleAndEveryLabel) {
  auto data = std::make_shared<TokenizedDataset>();
  uint64_t s = 3;
  for (int i = 0; i < 40; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const int64_t len = 1 + int64_t((s >> 33) % 30);
    std::vector<int32_t> t(static_cast<size_t>(len));
    std::vector<uint8_t> m(static_cast<size_t>(len));
    for (int64_t k = 0; k < len; ++k) {
      t[size_t(k)] = int32_t(1 + i * 100 + k);
      m[size_t(k)] = k % 4 != 0;
    }
    data->add(t, m);
  }
  LoaderOptions o;
  o.batch_size = 4;
  o.seed = 9;
  o.pad_id = kPad;
  DataLoader loader(data, o);
  loader.set_epoch(0);
  Batch padded;
  int batches = 0;
  int64_t padded_positions = 0, row_positions = 0;
  while (loader.next(&padded)) {
    ++batches;
    shift_labels(padded);
    const int64_t T = padded.seq_len;
    for (int64_t max_row_len : {T, kOneRow}) {
      SCOPED_TRACE("batch " + std::to_string(padded.index) + ", max_row_len " + std::to_string(max_row_len));
      const Batch rows = remove_padding(padded, max_row_len);
      EXPECT_EQ(rows.num_label_tokens(), padded.num_label_tokens());
      if (max_row_len == kOneRow) {
        EXPECT_EQ(rows.batch_size, 1);
      } else {
        EXPECT_LE(rows.batch_size, padded.batch_size);
        EXPECT_LE(rows.seq_len, T);
        padded_positions += padded.batch_size * T;
        row_positions += rows.batch_size * rows.seq_len;
      }
      // Each sample's span in the rows: its doc id's positions.
      std::map<int32_t, std::vector<size_t>> spans;
      for (size_t n = 0; n < rows.doc_ids.size(); ++n) spans[rows.doc_ids[n]].push_back(n);
      for (int64_t b = 0; b < padded.batch_size; ++b) {
        int64_t len = 0;
        while (len < T && padded.tokens[size_t(b * T + len)] != kPad) ++len;
        const std::vector<size_t>& at = spans[int32_t(b)];
        ASSERT_EQ(int64_t(at.size()), len) << "sample of row " << b;
        for (int64_t t = 0; t < len; ++t) {
          const size_t n = at[size_t(t)];
          EXPECT_EQ(n, at[0] + size_t(t)) << "sample of row " << b << " is not contiguous";
          EXPECT_EQ(rows.tokens[n], padded.tokens[size_t(b * T + t)]);
          EXPECT_EQ(rows.labels[n], padded.labels[size_t(b * T + t)]);
          EXPECT_EQ(rows.positions[n], t);
        }
      }
      const auto padding = spans.find(-1);
      if (padding != spans.end()) {
        EXPECT_NE(max_row_len, kOneRow) << "one row has no padding";
        for (size_t n : padding->second) EXPECT_EQ(rows.labels[n], kIgnoreIndex);
      }
    }
  }
  EXPECT_EQ(batches, 10);
  EXPECT_LT(row_positions, padded_positions);
}

TEST(PaddingFree, RefusesLabelledPaddingTokensAfterPaddingAndTooShortRows) {
  Batch labelled = padded_batch({{1, 2, 3}, {4}}, {{1, 2, 3}, {4}});
  labelled.labels[5] = 9;  // row 1, position 2: padding
  EXPECT_THROW(remove_padding(labelled, 3), Error);
  Batch gap = padded_batch({{1, 2, 3}, {4}}, {{1, 2, 3}, {4}});
  gap.doc_ids[5] = 0;  // row 1: sample, padding, sample
  try {
    remove_padding(gap, 3);
    FAIL() << "a sample token after padding was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("row 1, position 2"), std::string::npos) << e.what();
  }
  Batch short_labels = padded_batch({{1, 2}}, {{1, 2}});
  short_labels.labels.pop_back();
  EXPECT_THROW(remove_padding(short_labels, 2), Error);
  Batch fine = padded_batch({{1, 2, 3}, {4}}, {{1, 2, 3}, {4}});
  EXPECT_THROW(remove_padding(fine, 2), Error);  // the longest sample has 3 tokens
}

}  // namespace
}  // namespace ktune
