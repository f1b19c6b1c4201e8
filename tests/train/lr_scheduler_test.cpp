#include "train/lr_scheduler.h"

#include <gtest/gtest.h>

#include <cmath>

using namespace ktune;

TEST(CosineWithWarmup, RisesLinearlyThenFollowsAHalfCosineToZero) {
  CosineWithWarmup schedule{.num_warmup_steps = 10, .num_training_steps = 110};
  EXPECT_DOUBLE_EQ(schedule.multiplier(0), 0.0);
  EXPECT_DOUBLE_EQ(schedule.multiplier(5), 0.5);
  EXPECT_DOUBLE_EQ(schedule.multiplier(10), 1.0);
  EXPECT_NEAR(schedule.multiplier(60), 0.5, 1e-12);             // halfway through the decay
  EXPECT_NEAR(schedule.multiplier(35), 0.5 * (1 + std::cos(M_PI * 0.25)), 1e-12);
  EXPECT_NEAR(schedule.multiplier(110), 0.0, 1e-12);
}

TEST(CosineWithWarmup, NoWarmupStartsAtThePeak) {
  CosineWithWarmup schedule{.num_warmup_steps = 0, .num_training_steps = 4};
  EXPECT_DOUBLE_EQ(schedule.multiplier(0), 1.0);
  EXPECT_LT(schedule.multiplier(1), 1.0);
}

TEST(CosineWithWarmup, NeverNegativePastTheEnd) {
  CosineWithWarmup schedule{.num_warmup_steps = 2, .num_training_steps = 10};
  for (int64_t step = 0; step < 30; ++step) EXPECT_GE(schedule.multiplier(step), 0.0);
}
