// to_fixed_shape(): an unpacked, label-shifted batch laid into a larger (B, T) — each row's tokens
// and labels at the front of its row, token padding pad_id and label padding -100 behind them and
// in the extra rows; a batch of exactly (B, T) unchanged; and the refusals naming the batch.
#include <gtest/gtest.h>

#include "core/error.h"
#include "data/data_loader.h"
#include "data/fixed_shape_batch.h"

namespace ktune {
namespace {

// (2, 3): rows [5 6 7] / [8 9 pad], labels already shifted.
Batch two_by_three() {
  Batch b;
  b.batch_size = 2;
  b.seq_len = 3;
  b.tokens = {5, 6, 7, 8, 9, 0};
  b.labels = {6, 7, -100, 9, -100, -100};
  b.positions = {0, 1, 2, 0, 1, 2};
  b.doc_ids = {0, 0, 0, 0, 0, 1};
  b.epoch = 1;
  b.index = 4;
  return b;
}

TEST(FixedShapeBatch, RowsGoToTheFrontOfTheirRowsAndEverythingElseIsPadding) {
  const FixedShapeBatch f = to_fixed_shape(two_by_three(), 3, 5, /*pad_id=*/2);
  EXPECT_EQ(f.batch_size, 3);
  EXPECT_EQ(f.seq_len, 5);
  const std::vector<int32_t> tokens = {5, 6, 7, 2, 2, /**/ 8, 9, 0, 2, 2, /**/ 2, 2, 2, 2, 2};
  const std::vector<int32_t> labels = {6, 7, -100, -100, -100, /**/ 9, -100, -100, -100, -100, /**/
                                       -100, -100, -100, -100, -100};
  EXPECT_EQ(f.tokens, tokens);
  EXPECT_EQ(f.labels, labels);
}

TEST(FixedShapeBatch, ABatchOfTheShapeItselfIsUnchanged) {
  const Batch b = two_by_three();
  const FixedShapeBatch f = to_fixed_shape(b, 2, 3, 2);
  EXPECT_EQ(f.tokens, b.tokens);
  EXPECT_EQ(f.labels, b.labels);
}

TEST(FixedShapeBatch, ABatchLongerOrWiderThanTheShapeIsRefusedNamingIt) {
  for (auto [B, T] : {std::pair<int64_t, int64_t>{1, 3}, {2, 2}}) {
    try {
      to_fixed_shape(two_by_three(), B, T, 2);
      FAIL() << "accepted a (2, 3) batch into (" << B << ", " << T << ")";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("batch 4 of epoch 1"), std::string::npos) << what;
      EXPECT_NE(what.find("(2, 3)"), std::string::npos) << what;
    }
  }
}

}  // namespace
}  // namespace ktune
