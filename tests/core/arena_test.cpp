#include "core/arena.h"

#include <gtest/gtest.h>

#include "core/error.h"

using namespace ktune;

TEST(Arena, TakesAlignedBlocksAndReleasesToMark) {
  Arena arena(1024);
  Tensor a = arena.take({3});  // 12 bytes, rounds to 64
  size_t mark = arena.mark();
  Tensor b = arena.take({16});
  EXPECT_EQ(arena.used(), 128u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.raw()) % kTensorAlignment, 0u);
  arena.release(mark);
  EXPECT_EQ(arena.used(), 64u);
  EXPECT_EQ(arena.peak(), 128u);
}

TEST(Arena, RefusesToGrowPastItsPlan) {
  Arena arena(128);
  arena.take({16});
  arena.take({16});
  EXPECT_THROW(arena.take({1}), Error);
}

TEST(Arena, ViewsOutliveTheArenaObject) {
  Tensor kept;
  {
    Arena arena(256);
    kept = arena.take({4});
    kept.f32()[3] = 5.0f;
  }
  EXPECT_EQ(kept.f32()[3], 5.0f);
}
