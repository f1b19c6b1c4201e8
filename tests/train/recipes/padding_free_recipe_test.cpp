// Padding-free training steps end to end (data/padding_free.h, the recipe's KTUNE_PADDING_FREE):
// on samples of very different lengths, a run that lays each unpacked batch as a single row (the
// default) and one that re-lays them as rows of at most T log the same training and validation
// losses as a run that keeps the padding (KTUNE_PADDING_FREE=0) — sharded (the distributed LoRA
// recipe on one process) and full fine-tuning with activation checkpointing and gradient
// accumulation — while each says how many padded positions it skipped. An unknown value is refused.
#include <cstdlib>
#include <fstream>
#include <regex>

#include "tiny_recipe_run.h"

using ktune::recipe_testing::losses;
using ktune::recipe_testing::Outcome;

namespace {

class PaddingFreeRecipeTest : public ktune::recipe_testing::TinyModelRecipeTest {
 protected:
  // 48 alpaca rows whose answers run from 1 to 60 words: batches of 8 with much padding, and
  // short samples that share a row of the longest one's length.
  std::string varied_lengths_data() const {
    const std::string path = (dir_ / "varied.jsonl").string();
    std::ofstream f(path);
    const int words[] = {1, 30, 3, 60, 8, 2, 45, 15, 5, 20, 1, 12, 40, 4, 9, 25};
    for (int i = 0; i < 48; ++i) {
      std::string answer;
      for (int w = 0; w < words[i % 16]; ++w) {
        if (w) answer += ' ';
        answer += std::to_string(i + w);
      }
      f << "{\"instruction\": \"Count on from " << i << ".\", \"input\": \"\", \"output\": \"" << answer << "\"}\n";
    }
    return path;
  }

  // The run with env KTUNE_PADDING_FREE=mode ("" = unset).
  Outcome run_mode(const std::string& mode, const std::string& recipe, const std::string& config, const std::string& extra,
                   const std::string& output) {
    if (mode.empty()) unsetenv("KTUNE_PADDING_FREE");
    else setenv("KTUNE_PADDING_FREE", mode.c_str(), 1);
    Outcome r = run_tiny("", recipe, config, "dtype=fp32 " + extra, output);
    unsetenv("KTUNE_PADDING_FREE");
    return r;
  }
};

// From the run's summary line: positions computed, sample tokens, padded positions, skipped.
struct Positions {
  long computed = -1, real = -1, padded = -1, skipped = -1;
};

Positions positions_line(const std::string& output) {
  const std::regex line("computed (\\d+) positions for (\\d+) sample tokens; padded, the batches hold (\\d+) "
                        "\\([0-9.]+% padding\\): (\\d+) positions");
  std::smatch m;
  Positions p;
  if (std::regex_search(output, m, line)) {
    p.computed = std::stol(m[1]);
    p.real = std::stol(m[2]);
    p.padded = std::stol(m[3]);
    p.skipped = std::stol(m[4]);
  }
  return p;
}

// Logged losses (4 decimals) agree to their last digit: the runs differ only in f32 rounding.
void expect_same_losses(const std::map<int, double>& got, const std::map<int, double>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [step, loss] : want) EXPECT_NEAR(got.at(step), loss, 1.01e-4) << what << ", step " << step;
}

}  // namespace

TEST_F(PaddingFreeRecipeTest, ShardedLoraRunsLogTheSameLossesAsThePaddedRun) {
  const std::string data = varied_lengths_data();
  const std::string args = "epochs=1 max_steps_per_epoch=4 batch_size=8 shuffle=False dataset.data_files=" + data +
                           " dataset_val._component_=torchtune.datasets.alpaca_dataset dataset_val.source=json "
                           "dataset_val.data_files=" + data + " run_val_every_n_steps=2";
  Outcome padded = run_mode("0", "lora_finetune_distributed", "lora_single_device", args, out("padded"));
  Outcome rows = run_mode("rows", "lora_finetune_distributed", "lora_single_device", args, out("rows"));
  Outcome one_row = run_mode("", "lora_finetune_distributed", "lora_single_device", args, out("one_row"));
  ASSERT_EQ(padded.exit_code, 0) << padded.output;
  ASSERT_EQ(rows.exit_code, 0) << rows.output;
  ASSERT_EQ(one_row.exit_code, 0) << one_row.output;
  EXPECT_NE(one_row.output.find("sharded data parallel (FSDP) over 1 ranks"), std::string::npos) << one_row.output;

  const auto want = losses(out("padded"));
  ASSERT_EQ(want.size(), 4u) << padded.output;
  expect_same_losses(losses(out("rows")), want, "rows of at most T");
  expect_same_losses(losses(out("one_row")), want, "one row");
  const auto want_val = losses(out("padded"), "val_loss");
  ASSERT_EQ(want_val.size(), 2u) << padded.output;
  expect_same_losses(losses(out("rows"), "val_loss"), want_val, "rows of at most T, validation");
  expect_same_losses(losses(out("one_row"), "val_loss"), want_val, "one row, validation");

  // The same batches each time; padded, all of them computed; one row, only the samples' tokens;
  // rows of at most T, some padding skipped (short samples share rows) but not all.
  const Positions p = positions_line(padded.output), r = positions_line(rows.output), o = positions_line(one_row.output);
  ASSERT_GT(p.padded, 0) << padded.output;
  EXPECT_EQ(p.computed, p.padded);
  EXPECT_EQ(p.skipped, 0);
  EXPECT_LT(p.real, p.padded);
  EXPECT_EQ(r.padded, p.padded);
  EXPECT_EQ(r.real, p.real);
  EXPECT_GT(r.skipped, 0) << rows.output;
  EXPECT_EQ(r.computed + r.skipped, r.padded);
  EXPECT_EQ(o.computed, p.real) << one_row.output;
  EXPECT_EQ(o.skipped, p.padded - p.real);
  EXPECT_NE(rows.output.find("padding-free (rows of at most T)"), std::string::npos) << rows.output;
  EXPECT_NE(one_row.output.find("padding-free (one row)"), std::string::npos) << one_row.output;
}

// (Offloading on too: the CPU engine says it has nothing to offload.)
TEST_F(PaddingFreeRecipeTest, FullFinetuneWithCheckpointingAndAccumulationLogsTheSameLosses) {
  const std::string args = "epochs=1 max_steps_per_epoch=3 batch_size=4 gradient_accumulation_steps=2 shuffle=False "
                           "enable_activation_checkpointing=True enable_activation_offloading=True "
                           "dataset.data_files=" + varied_lengths_data();
  Outcome padded = run_mode("0", "full_finetune_single_device", "full_single_device", args, out("padded"));
  Outcome one_row = run_mode("1", "full_finetune_single_device", "full_single_device", args, out("one_row"));
  ASSERT_EQ(padded.exit_code, 0) << padded.output;
  ASSERT_EQ(one_row.exit_code, 0) << one_row.output;
  const auto want = losses(out("padded"));
  ASSERT_EQ(want.size(), 3u) << padded.output;
  expect_same_losses(losses(out("one_row")), want, "one row");
  const Positions o = positions_line(one_row.output);
  EXPECT_EQ(o.computed, o.real) << one_row.output;
  EXPECT_GT(o.skipped, 0) << one_row.output;
  EXPECT_NE(padded.output.find("enable_activation_offloading: nothing to do on the CPU engine"), std::string::npos)
      << padded.output;
}

TEST_F(PaddingFreeRecipeTest, AnUnknownModeIsRefused) {
  Outcome r = run_mode("yes", "lora_finetune_single_device", "lora_single_device", "epochs=1 max_steps_per_epoch=1", out());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("KTUNE_PADDING_FREE"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("one_row"), std::string::npos) << r.output;
}
