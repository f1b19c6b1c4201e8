// The bundled quickstart dataset (data/quickstart/): both copies hold the same rows (half sorting
// three digits, half reversing four), every answer follows its rule (so a held-out answer can be
// checked), validation prompts are unseen in train, and it builds as an alpaca dataset through the
// parquet data_dir path upstream runtimes use.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include "data/data_source.h"
#include "data/dataset_builders.h"
#include "fixture_cases.h"

namespace ktune {
namespace {

const std::string kRoot = std::string(KTUNE_SOURCE_DIR) + "/data/quickstart";

std::vector<DataRow> rows_of(const DataFiles& files, const std::string& split) {
  std::vector<DataRow> out;
  read_split_rows(files, split, [&](const DataRow& row, const RowPlace&) { out.push_back(row); });
  return out;
}

// The digits of a list like "4, 3, 1", in order.
std::vector<int> digits_of(const std::string& list) {
  std::vector<int> v;
  for (char c : list)
    if (std::isdigit((unsigned char)c)) v.push_back(c - '0');
  return v;
}

std::string listed(const std::vector<int>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out;
}

std::string expected_answer(const std::string& instruction, const std::string& input) {
  std::vector<int> v = digits_of(input);
  EXPECT_EQ(listed(v), input) << "not a list of digits";
  if (instruction == "Sort the numbers from smallest to largest.") {
    EXPECT_EQ(v.size(), 3u) << input;
    std::sort(v.begin(), v.end());
    return listed(v);
  }
  if (instruction == "Reverse the list.") {
    EXPECT_EQ(v.size(), 4u) << input;
    std::reverse(v.begin(), v.end());
    return listed(v);
  }
  return "(unknown task)";
}

TEST(QuickstartDataset, ParquetAndJsonlHoldTheSameRuleAbidingRows) {
  DataFiles parquet = resolve_data_files("parquet", kRoot + "/data", {});
  DataFiles jsonl = resolve_data_files("json", kRoot + "/jsonl", {});
  std::set<std::string> train_prompts;
  for (const char* split : {"train", "validation"}) {
    auto p = rows_of(parquet, split), j = rows_of(jsonl, split);
    ASSERT_EQ(p, j) << split;
    ASSERT_EQ(p.size(), std::string(split) == "train" ? 320u : 40u);
    std::map<std::string, int> per_task;
    for (const auto& r : p) {
      ++per_task[r["instruction"]];
      const std::string instruction = r["instruction"], input = r["input"], output = r["output"];
      EXPECT_EQ(output, expected_answer(instruction, input)) << instruction << " | " << input;
      const std::string prompt = instruction + "|" + input;
      if (std::string(split) == "train") train_prompts.insert(prompt);
      else EXPECT_EQ(train_prompts.count(prompt), 0u) << "held-out prompt seen in train: " << prompt;
    }
    // Half of each split is each task.
    EXPECT_EQ(per_task.size(), 2u) << split;
    for (const auto& [task, n] : per_task) EXPECT_EQ(size_t(n) * 2, p.size()) << split << ": " << task;
  }
}

TEST(QuickstartDataset, BuildsAsAnAlpacaDatasetFromTheParquetFolder) {
  testing::ByteTokenizer tok(testing::ByteTokenizer::Flavour::kLlama3);
  ChatFormat format(tok, ChatFormatKind::kLlama3, 512);
  DatasetOptions o;
  o.component = "torchtune.datasets.alpaca_dataset";
  o.source = "parquet";
  o.data_dir = kRoot + "/data";
  TokenizedDataset d = build_dataset(o, format);
  EXPECT_EQ(d.size(), 320);
  EXPECT_EQ(d.num_truncated, 0);
  // Short rows: with this byte-level tokenizer a token is a byte, and the alpaca prompt alone is
  // ~180 of them, so under 300 bytes a sample means the answers are a few words at most.
  EXPECT_LT(d.num_tokens() / d.size(), 300);
}

}  // namespace
}  // namespace ktune
