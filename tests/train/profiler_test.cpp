// The step profiler (train/profiler.h): which steps it records on torchtune's schedule (wait,
// warmup, active, cycles), the folders and files it writes at each cycle's end, the Chrome trace's
// events (complete "X" events, microseconds, nested as recorded) and the key averages. The recipe
// test (tests/train/recipes/recipe_test.cpp, TheProfilerRecordsTheActiveStepsOfEachCycle) runs it in
// a real fine-tune.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/trace_spans.h"
#include "train/profiler.h"

namespace ktune {
namespace {

namespace fs = std::filesystem;

std::string read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Steps 0..n-1 of a run, each a "step k" span with two layer spans inside.
void run_steps(StepProfiler& profiler, int64_t n) {
  for (int64_t k = 0; k < n; ++k) {
    profiler.begin_step(k);
    {
      trace::Span step("step", "step", k + 1);
      trace::Span layer0("forward", "layer", 0);
    }
    trace::Span outside("phase", "between steps");  // after end_step's view: never recorded
    profiler.end_step(k, k + 1);
  }
}

TEST(StepProfiler, RecordsTheActiveStepsOfEachCycleAndWritesAtItsEnd) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("ktune_profiler_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  ProfilerOptions o;
  o.output_dir = dir.string();
  o.wait_steps = 1, o.warmup_steps = 1, o.active_steps = 2, o.num_cycles = 2;
  StepProfiler profiler(o, 3);
  run_steps(profiler, 10);  // cycles of 4: steps 3-4 and 7-8 (1-based) recorded; 9-10 after the last cycle
  EXPECT_EQ(profiler.finish(10), (std::vector<std::string>{(dir / "iteration_4").string(), (dir / "iteration_8").string()}));
  EXPECT_FALSE(trace::recording());

  const nlohmann::json trace = nlohmann::json::parse(read(dir / "iteration_8" / "rank3_trace.json"));
  std::vector<std::string> names;
  for (const auto& e : trace["traceEvents"]) {
    EXPECT_EQ(e["ph"], "X");
    EXPECT_EQ(e["pid"], 3);
    EXPECT_GE(e["ts"].get<double>(), 0.0);
    EXPECT_GE(e["dur"].get<double>(), 0.0);
    names.push_back(e["name"]);
  }
  // By start time: each step, then the layer inside it.
  EXPECT_EQ(names, (std::vector<std::string>{"step 7", "layer 0", "step 8", "layer 0"}));
  EXPECT_EQ(trace["traceEvents"][1]["cat"], "forward");
  const std::string table = read(dir / "iteration_4" / "rank3_key_averages.txt");
  EXPECT_NE(table.find("step | step 3"), std::string::npos) << table;
  EXPECT_NE(table.find("forward | layer 0                                             2"), std::string::npos) << table;
  EXPECT_FALSE(fs::exists(dir / "iteration_10"));
  fs::remove_all(dir);
}

TEST(StepProfiler, NoCycleLimitRepeatsAndARunEndingInsideAWindowWritesIt) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("ktune_profiler_cut_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  ProfilerOptions o;
  o.output_dir = dir.string();
  o.wait_steps = 0, o.warmup_steps = 0, o.active_steps = 3, o.num_cycles = 0;
  StepProfiler profiler(o, 0);
  run_steps(profiler, 7);  // 1-3, 4-6 written; 7 recorded when the run ends
  EXPECT_EQ(profiler.finish(7).size(), 3u);
  const nlohmann::json last = nlohmann::json::parse(read(dir / "iteration_7" / "rank0_trace.json"));
  EXPECT_EQ(last["traceEvents"].size(), 2u);  // step 7 and its layer
  fs::remove_all(dir);

  ProfilerOptions none = o;
  none.active_steps = 0;
  EXPECT_THROW(StepProfiler(none, 0), Error);
  none.active_steps = 1, none.wait_steps = -1;
  EXPECT_THROW(StepProfiler(none, 0), Error);
}

TEST(TraceSpans, CostNothingAndRecordNothingWhileOff) {
  trace::set_recording(false);
  trace::take();
  { trace::Span s("phase", "off"); }
  EXPECT_TRUE(trace::take().empty());
  trace::set_recording(true);
  { trace::Span s("phase", "on", 2); }
  trace::set_recording(false);
  const std::vector<trace::SpanRecord> spans = trace::take();
  ASSERT_EQ(spans.size(), 1u);
  EXPECT_EQ(spans[0].name, "on 2");
  EXPECT_EQ(spans[0].category, "phase");
}

}  // namespace
}  // namespace ktune
