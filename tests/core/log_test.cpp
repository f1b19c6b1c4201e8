#include "core/log.h"

#include <gtest/gtest.h>

using namespace ktune;

TEST(Log, RedactsRegisteredSecretsAndTokenShapes) {
  register_secret("s3cr3t-value");
  std::string line = redact("token=s3cr3t-value and hf_aBcDeFgHiJkLmNoPqRsTuVwXyZ01234567, Authorization: Bearer xyz.abc");
  EXPECT_EQ(line.find("s3cr3t-value"), std::string::npos);
  EXPECT_EQ(line.find("hf_aBcDeFgHiJkLmNoPqRsTuVwXyZ01234567"), std::string::npos);
  EXPECT_NE(line.find("and ***,"), std::string::npos);
  EXPECT_EQ(redact("HF_TOKEN=hf_aBcDeFgHiJkLmNoPqRsTuVwXyZ01234567"), "HF_TOKEN=***");
  EXPECT_EQ(line.find("xyz.abc"), std::string::npos);
  EXPECT_NE(line.find("token=***"), std::string::npos);
}

TEST(Log, LeavesOrdinaryTextAlone) {
  EXPECT_EQ(redact("Step 3 | loss: 2.31 lr: 0.0003"), "Step 3 | loss: 2.31 lr: 0.0003");
  // Component names that merely contain "hf_" are not tokens.
  EXPECT_EQ(redact("tokenizer._component_=ktune.models.hf_tokenizer"), "tokenizer._component_=ktune.models.hf_tokenizer");
  EXPECT_EQ(redact("model: ktune.models.lora_hf_model"), "model: ktune.models.lora_hf_model");
}

// An error quoting a damaged file's bytes prints them as \xHH, never raw to the terminal; valid UTF-8
// (a CJK file name, an emoji), newlines and tabs stay as they are.
TEST(Log, PrintableEscapesControlBytesAndInvalidUtf8Only) {
  EXPECT_EQ(printable("last read: '\"\xff' at \x1b[31m"), "last read: '\"\\xFF' at \\x1B[31m");
  EXPECT_EQ(printable("数据/训练.jsonl: row 3 \xF0\x9F\x98\x80\n\tnext"), "数据/训练.jsonl: row 3 \xF0\x9F\x98\x80\n\tnext");
  EXPECT_EQ(printable("\xC0\xAF \xED\xA0\x80 \xE4\xB8"), "\\xC0\\xAF \\xED\\xA0\\x80 \\xE4\\xB8");  // overlong, surrogate, cut
  EXPECT_EQ(printable(std::string("nul\0byte\x7f", 9)), "nul\\x00byte\\x7F");
}
