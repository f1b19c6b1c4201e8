// to_fixed_shape(): an unpacked, label-shifted batch laid into a larger (B, T) — each row's tokens
// and labels at the front of its row, token padding pad_id and label padding -100 behind them and
// in the extra rows; a batch of exactly (B, T) unchanged; and the refusals naming the batch. Packed,
// the positions and doc ids come along, the added padding in its own document.
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

// A packed (2, 4) batch: row 0 two samples [5 6 | 7] and the pack's padding (its own doc id 2),
// row 1 one sample split in from the previous pack (positions continue from 3) and a second one.
Batch two_packs() {
  Batch b;
  b.batch_size = 2;
  b.seq_len = 4;
  b.tokens = {5, 6, 7, 0, /**/ 8, 9, 10, 11};
  b.labels = {6, -100, -100, -100, /**/ 9, -100, 11, -100};
  b.positions = {0, 1, 0, 1, /**/ 3, 4, 0, 1};
  b.doc_ids = {0, 0, 1, 2, /**/ 0, 0, 1, 1};
  return b;
}

TEST(FixedShapeBatch, APackedBatchKeepsItsPositionsAndDocIdsAndItsAddedPaddingIsADocumentOfItsOwn) {
  const FixedShapeBatch f = to_fixed_shape(two_packs(), 3, 6, /*pad_id=*/0, /*packed=*/true);
  ASSERT_TRUE(f.packed());
  const int32_t p = kFixedShapePaddingDoc;
  const std::vector<int32_t> tokens = {5, 6, 7, 0, 0, 0, /**/ 8, 9, 10, 11, 0, 0, /**/ 0, 0, 0, 0, 0, 0};
  const std::vector<int32_t> positions = {0, 1, 0, 1, 0, 0, /**/ 3, 4, 0, 1, 0, 0, /**/ 0, 0, 0, 0, 0, 0};
  const std::vector<int32_t> doc_ids = {0, 0, 1, 2, p, p, /**/ 0, 0, 1, 1, p, p, /**/ p, p, p, p, p, p};
  EXPECT_EQ(f.tokens, tokens);
  EXPECT_EQ(f.positions, positions);
  EXPECT_EQ(f.doc_ids, doc_ids);
  EXPECT_EQ(f.labels[9], -100);  // the added padding trains nothing
  EXPECT_EQ(f.labels[6], 9);
  // No pack's own document is the added padding's.
  for (int32_t d : two_packs().doc_ids) EXPECT_NE(d, kFixedShapePaddingDoc);
  // Unpacked, the same batch brings neither along (the step then masks causally only).
  EXPECT_FALSE(to_fixed_shape(two_packs(), 3, 6, 0).packed());
  EXPECT_TRUE(to_fixed_shape(two_packs(), 3, 6, 0).positions.empty());
}

// step_seq_len: the batch's own longest row rounded up to the multiple, capped at the planned T; a
// batch longer than that keeps its length, and to_fixed_shape refuses it.
TEST(FixedShapeBatch, AStepTakesTheBatchsLongestRowRoundedUpAndCappedAtThePlan) {
  Batch b = two_by_three();
  EXPECT_EQ(step_seq_len(b, 16, 40), 16);
  EXPECT_EQ(step_seq_len(b, 1, 40), 3);
  EXPECT_EQ(step_seq_len(b, 3, 40), 3);
  EXPECT_EQ(step_seq_len(b, 16, 10), 10);  // capped
  EXPECT_EQ(step_seq_len(b, 16, 3), 3);
  b.seq_len = 16;
  EXPECT_EQ(step_seq_len(b, 16, 40), 16);
  b.seq_len = 17;
  EXPECT_EQ(step_seq_len(b, 16, 40), 32);
  b.seq_len = 35;
  EXPECT_EQ(step_seq_len(b, 16, 40), 40);
  b.seq_len = 41;
  EXPECT_EQ(step_seq_len(b, 16, 40), 41);
  EXPECT_THROW(step_seq_len(b, 0, 40), Error);

  const Batch short_rows = two_by_three();  // laid into (2, 16), not the plan's (2, 40)
  const FixedShapeBatch f = to_fixed_shape(short_rows, 2, step_seq_len(short_rows, 16, 40), 2);
  EXPECT_EQ(f.seq_len, 16);
  ASSERT_EQ(f.tokens.size(), size_t(32));
  EXPECT_EQ(std::vector<int32_t>(f.tokens.begin() + 16, f.tokens.begin() + 19), (std::vector<int32_t>{8, 9, 0}));
  EXPECT_EQ(f.labels[3], -100);
  EXPECT_EQ(f.labels[16], 9);
}

}  // namespace
}  // namespace ktune
