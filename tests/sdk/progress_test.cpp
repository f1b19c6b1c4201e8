// The progress contract's reading side: valid, partial and malformed lines, head and tail of long
// files, percent and both ways of estimating the time left.
#include <gtest/gtest.h>

#include <fstream>

#include "sdk/progress.h"
#include "test_home.h"

namespace ktune::sdk {
namespace {

using testing::TempHome;

TEST(ProgressLine, ParsesTheContractFieldsAndKeepsOtherNumbersAsMetrics) {
  auto r = parse_progress_line(
      R"({"step":7,"total_steps":70,"epoch":1.5,"loss":1.25,"lr":0.0002,"tokens_per_second":950.5,"grad_norm":0.8,"time":1000.5,"note":"x"})");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->step, 7);
  EXPECT_EQ(r->total_steps, 70);
  EXPECT_DOUBLE_EQ(r->epoch, 1.5);
  ASSERT_TRUE(r->time);
  EXPECT_DOUBLE_EQ(*r->time, 1000.5);
  EXPECT_DOUBLE_EQ(r->metrics.at("loss"), 1.25);
  EXPECT_DOUBLE_EQ(r->metrics.at("lr"), 0.0002);
  EXPECT_DOUBLE_EQ(r->metrics.at("tokens_per_second"), 950.5);
  EXPECT_DOUBLE_EQ(r->metrics.at("grad_norm"), 0.8);
  EXPECT_EQ(r->metrics.count("note"), 0u);  // not a number
  EXPECT_EQ(r->metrics.count("step"), 0u);
}

TEST(ProgressLine, RejectsWhatIsNotAReport) {
  EXPECT_FALSE(parse_progress_line(""));
  EXPECT_FALSE(parse_progress_line("{\"step\":3,\"total"));
  EXPECT_FALSE(parse_progress_line("[1,2]"));
  EXPECT_FALSE(parse_progress_line("{\"loss\":1.0}"));
  EXPECT_FALSE(parse_progress_line("{\"step\":\"3\"}"));
}

TEST(ProgressFile, TakesTheFirstAndLatestValidLinesSkippingPartialAndMalformedOnes) {
  TempHome home;
  const std::string path = home.path() + "/p.jsonl";
  {
    std::ofstream out(path);
    out << "garbage\n";
    out << R"({"step":1,"total_steps":10,"loss":3.0})" << "\n";
    out << R"({"step":2,"total_steps":10,"loss":2.0})" << "\n";
    out << "not json either\n";
    out << R"({"step":3,"total_)";  // the writer is mid-line
  }
  auto span = read_progress_file(path);
  ASSERT_TRUE(span);
  EXPECT_EQ(span->first.step, 1);
  EXPECT_EQ(span->latest.step, 2);
  EXPECT_DOUBLE_EQ(span->latest.metrics.at("loss"), 2.0);
  EXPECT_FALSE(read_progress_file(home.path() + "/missing.jsonl"));
  std::ofstream(home.path() + "/empty.jsonl").close();
  EXPECT_FALSE(read_progress_file(home.path() + "/empty.jsonl"));
}

TEST(ProgressFile, ReadsOnlyTheEndsOfALongFile) {
  TempHome home;
  const std::string path = home.path() + "/p.jsonl";
  {
    std::ofstream out(path);
    for (int i = 1; i <= 20000; ++i)
      out << R"({"step":)" << i << R"(,"total_steps":20000,"loss":)" << 1.0 / i << "}\n";
  }
  auto span = read_progress_file(path);
  ASSERT_TRUE(span);
  EXPECT_EQ(span->first.step, 1);
  EXPECT_EQ(span->latest.step, 20000);
}

TEST(ProgressSummary, PercentAndEtaFromTheTrainersClock) {
  ProgressSpan span;
  span.first.step = 10;
  span.first.time = 100.0;
  span.latest.step = 30;
  span.latest.total_steps = 130;
  span.latest.time = 110.0;  // 20 steps in 10 s: 2 steps/s, 100 steps left -> 50 s
  span.latest.metrics = {{"loss", 1.5}};
  JobProgress p = summarize_progress(span, /*started_at=*/0, /*now=*/110.0, false);
  EXPECT_TRUE(p.present);
  EXPECT_NEAR(p.progress_percentage, 100.0 * 30 / 130, 1e-9);
  EXPECT_NEAR(p.estimated_remaining_seconds, 50.0, 1e-9);
  // Seen 4 s after the latest report: 4 s fewer left.
  EXPECT_NEAR(summarize_progress(span, 0, 114.0, false).estimated_remaining_seconds, 46.0, 1e-9);
  EXPECT_DOUBLE_EQ(p.metrics.at("loss"), 1.5);
}

TEST(ProgressSummary, EtaFromTheNodesStartWhenReportsHaveNoTime) {
  ProgressSpan span;
  span.first.step = 5;
  span.latest.step = 5;
  span.latest.total_steps = 20;
  JobProgress p = summarize_progress(span, /*started_at=*/1000, /*now=*/1010, false);  // 5 steps in 10 s
  EXPECT_DOUBLE_EQ(p.progress_percentage, 25);
  EXPECT_NEAR(p.estimated_remaining_seconds, 30.0, 1e-9);
  EXPECT_DOUBLE_EQ(summarize_progress(span, 1000, 1010, /*finished=*/true).estimated_remaining_seconds, 0);
  span.latest.total_steps = 0;  // unknown total: no percent, no ETA
  JobProgress unknown = summarize_progress(span, 1000, 1010, false);
  EXPECT_EQ(unknown.progress_percentage, -1);
  EXPECT_EQ(unknown.estimated_remaining_seconds, -1);
}

TEST(ProgressSummary, RoundTripsThroughJson) {
  JobProgress p;
  p.present = true;
  p.step = 3;
  p.total_steps = 9;
  p.epoch = 0.5;
  p.progress_percentage = 33.3;
  p.estimated_remaining_seconds = 12;
  p.metrics = {{"loss", 2.0}, {"lr", 1e-4}};
  JobProgress q = JobProgress::from_json(p.to_json());
  EXPECT_TRUE(q.present);
  EXPECT_EQ(q.step, 3);
  EXPECT_EQ(q.total_steps, 9);
  EXPECT_DOUBLE_EQ(q.progress_percentage, 33.3);
  EXPECT_DOUBLE_EQ(q.estimated_remaining_seconds, 12);
  EXPECT_EQ(q.metrics, p.metrics);
  EXPECT_FALSE(JobProgress::from_json("").present);
  EXPECT_FALSE(JobProgress::from_json("nonsense").present);
}

}  // namespace
}  // namespace ktune::sdk
