#include "core/log.h"

#include <gtest/gtest.h>

using namespace ktune;

TEST(Log, RedactsRegisteredSecretsAndTokenShapes) {
  register_secret("s3cr3t-value");
  std::string line = redact("token=s3cr3t-value and hf_abcdefghijklmnop, Authorization: Bearer xyz.abc");
  EXPECT_EQ(line.find("s3cr3t-value"), std::string::npos);
  EXPECT_EQ(line.find("hf_abcdefghijklmnop"), std::string::npos);
  EXPECT_EQ(line.find("xyz.abc"), std::string::npos);
  EXPECT_NE(line.find("token=***"), std::string::npos);
}

TEST(Log, LeavesOrdinaryTextAlone) {
  EXPECT_EQ(redact("Step 3 | loss: 2.31 lr: 0.0003"), "Step 3 | loss: 2.31 lr: 0.0003");
}
