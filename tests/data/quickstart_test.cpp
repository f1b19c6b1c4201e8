// The bundled quickstart dataset (data/quickstart/): both copies hold the same rows, every answer
// follows its rule (so a held-out answer can be checked), validation prompts are unseen in train,
// and it builds as an alpaca dataset through the parquet data_dir path upstream runtimes use.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <sstream>

#include "data/data_source.h"
#include "data/dataset_builders.h"
#include "fixture_cases.h"

namespace ktune {
namespace {

const std::string kRoot = std::string(KTUNE_SOURCE_DIR) + "/data/quickstart";

std::vector<nlohmann::json> rows_of(const DataFiles& files, const std::string& split) {
  std::vector<nlohmann::json> out;
  read_split_rows(files, split, [&](const nlohmann::json& row, const RowPlace&) { out.push_back(row); });
  return out;
}

std::string expected_answer(const std::string& instruction, const std::string& input) {
  if (instruction == "Add the two numbers.") {
    int a, b;
    char plus;
    std::istringstream(input) >> a >> plus >> b;
    return std::to_string(a + b);
  }
  if (instruction == "Sort the numbers from smallest to largest.") {
    std::vector<int> v;
    for (char c : input)
      if (std::isdigit((unsigned char)c)) v.push_back(c - '0');
    std::sort(v.begin(), v.end());
    std::string out;
    for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
    return out;
  }
  const std::string prefix = "What number comes after ";
  if (instruction.rfind(prefix, 0) == 0) return std::to_string(std::stoi(instruction.substr(prefix.size())) + 1);
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
    for (const auto& r : p) {
      const std::string instruction = r["instruction"], input = r["input"], output = r["output"];
      EXPECT_EQ(output, expected_answer(instruction, input)) << instruction << " | " << input;
      const std::string prompt = instruction + "|" + input;
      if (std::string(split) == "train") train_prompts.insert(prompt);
      else EXPECT_EQ(train_prompts.count(prompt), 0u) << "held-out prompt seen in train: " << prompt;
    }
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
