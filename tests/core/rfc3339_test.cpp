#include "core/rfc3339.h"

#include <gtest/gtest.h>

using namespace ktune;

TEST(Rfc3339, ParsesUtcFractionsAndOffsets) {
  EXPECT_EQ(parse_rfc3339("2026-12-02T13:10:00Z"), 1796217000.0);
  EXPECT_EQ(parse_rfc3339("2026-12-02T13:10:00.5Z"), 1796217000.5);
  EXPECT_EQ(parse_rfc3339("2026-12-02T15:10:00+02:00"), 1796217000.0);
  EXPECT_EQ(parse_rfc3339("2026-12-02T11:40:00-01:30"), 1796217000.0);
  EXPECT_EQ(parse_rfc3339("yesterday"), 0.0);
  // To the nanosecond, as log lines carry it (Go's RFC3339Nano drops trailing zeros).
  EXPECT_EQ(parse_rfc3339_ns("2026-12-02T13:10:00Z"), 1796217000LL * 1000000000);
  EXPECT_EQ(parse_rfc3339_ns("2026-12-02T13:10:00.5Z"), 1796217000LL * 1000000000 + 500000000);
  EXPECT_EQ(parse_rfc3339_ns("2026-12-02T13:10:00.000000001Z"), 1796217000LL * 1000000000 + 1);
  EXPECT_EQ(parse_rfc3339_ns("2026-12-02T14:10:00.25+01:00"), 1796217000LL * 1000000000 + 250000000);
  EXPECT_EQ(parse_rfc3339_ns("2026-12-02T13:10:00.Z"), -1);
  EXPECT_EQ(parse_rfc3339_ns("2026-12-02T13:10:00Zjunk"), -1);
}

TEST(Rfc3339, FormatsUtcSecondsAndReadsThemBack) {
  EXPECT_EQ(format_rfc3339(1796217000), "2026-12-02T13:10:00Z");
  EXPECT_EQ(format_rfc3339(0), "1970-01-01T00:00:00Z");
  EXPECT_EQ(format_rfc3339((1796217000LL * 1000000000 + 999999999) / 1000000000), "2026-12-02T13:10:00Z");
  for (int64_t t : {int64_t(0), int64_t(951782400), int64_t(1796217000), int64_t(4102444799)})
    EXPECT_EQ(parse_rfc3339_ns(format_rfc3339(t)), t * 1000000000) << t;
}
