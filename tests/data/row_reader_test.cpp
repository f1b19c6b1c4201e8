// Readers and split/file resolution: the same rows from JSONL, a JSON array, CSV (awkward
// quoting, CRLF, embedded newlines), Parquet and both Arrow IPC framings; HF split slicing and
// file naming; and the bad inputs, each with an error that names its place.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "data/data_source.h"
#include "data/row_reader.h"
#include "fixture_cases.h"

namespace ktune {
namespace {

namespace fs = std::filesystem;
using testing::bad_dir;
using testing::files_dir;

std::vector<DataRow> all_rows(const std::string& path, DataFormat format) {
  std::vector<DataRow> rows;
  read_rows(path, format, [&](const DataRow& row, const RowPlace&) { rows.push_back(row); });
  return rows;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

void expect_contains(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "'" << part << "' not in: " << text;
}

TEST(RowReader, EveryFormatYieldsTheSameRows) {
  auto jsonl = all_rows(files_dir() + "/qa.jsonl", DataFormat::kJson);
  ASSERT_EQ(jsonl.size(), 13u);
  auto array = all_rows(files_dir() + "/qa_array.json", DataFormat::kJson);
  auto parquet = all_rows(files_dir() + "/qa.parquet", DataFormat::kParquet);
  auto stream = all_rows(files_dir() + "/qa.arrow", DataFormat::kArrow);
  auto file = all_rows(testing::fixtures_dir() + "/qa_ipc_file.arrow.bin", DataFormat::kArrow);
  auto csv = all_rows(files_dir() + "/qa.csv", DataFormat::kCsv);
  EXPECT_EQ(array, jsonl);
  EXPECT_EQ(parquet, jsonl);
  EXPECT_EQ(stream, jsonl);
  EXPECT_EQ(file, jsonl);
  ASSERT_EQ(csv.size(), jsonl.size());
  for (size_t i = 0; i < csv.size(); ++i) {  // CSV fields are strings
    EXPECT_EQ(csv[i]["question"], jsonl[i]["question"]) << i;
    EXPECT_EQ(csv[i]["answer"], jsonl[i]["answer"]) << i;
    EXPECT_EQ(csv[i]["id"], std::to_string(jsonl[i]["id"].get<int>())) << i;
  }
  EXPECT_EQ(jsonl[8]["question"], "Multi\nline\r\nquestion");  // embedded CRLF survives CSV quoting
  EXPECT_EQ(csv[8]["question"], "Multi\nline\r\nquestion");
  EXPECT_EQ(csv[7]["answer"], "She said \"hi\", then left.");
}

TEST(RowReader, CountsRowsWithoutReadingThemForParquetAndArrow) {
  EXPECT_EQ(count_rows(files_dir() + "/qa.parquet", DataFormat::kParquet), 13);
  EXPECT_EQ(count_rows(files_dir() + "/qa.arrow", DataFormat::kArrow), 13);
  EXPECT_EQ(count_rows(files_dir() + "/qa.csv", DataFormat::kCsv), 13);
}

TEST(RowReader, ParquetListsOfStructsBecomeMessageLists) {
  auto rows = all_rows(files_dir() + "/openai.parquet", DataFormat::kParquet);
  ASSERT_EQ(rows.size(), 3u);
  ASSERT_TRUE(rows[1]["messages"].is_array());
  EXPECT_EQ(rows[1]["messages"][0]["role"], "system");
  EXPECT_EQ(rows[1]["messages"][2]["content"], "Blue.");
}

TEST(RowReader, TextFilesGiveOneRowPerLineIncludingEmptyOnes) {
  auto rows = all_rows(files_dir() + "/lines.txt", DataFormat::kText);
  ASSERT_EQ(rows.size(), 6u);
  EXPECT_EQ(rows[1]["text"], "");
  EXPECT_EQ(rows[5]["text"], "Last line.");
}

TEST(RowReaderErrors, MalformedJsonLineNamesFileAndLine) {
  std::string e = error_of([] { all_rows(bad_dir() + "/malformed.jsonl", DataFormat::kJson); });
  expect_contains(e, "malformed.jsonl:3");
  expect_contains(e, "malformed JSON");
}

TEST(RowReaderErrors, InvalidUtf8NamesFileAndRow) {
  std::string e = error_of([] { all_rows(bad_dir() + "/invalid_utf8.jsonl", DataFormat::kJson); });
  expect_contains(e, "invalid_utf8.jsonl:2");
  expect_contains(e, "invalid UTF-8");
  e = error_of([] { all_rows(bad_dir() + "/invalid_utf8.csv", DataFormat::kCsv); });
  expect_contains(e, "invalid_utf8.csv: row 2 (line 5)");  // after a quoted field spanning lines 3-4
  expect_contains(e, "column 'input'");
  e = error_of([] { all_rows(bad_dir() + "/invalid_utf8.parquet", DataFormat::kParquet); });
  expect_contains(e, "invalid_utf8.parquet: row 1");
  expect_contains(e, "invalid UTF-8 in column 'input'");
}

TEST(RowReaderErrors, CsvRowWithWrongFieldCountAndUnclosedQuote) {
  std::string e = error_of([] { all_rows(bad_dir() + "/ragged.csv", DataFormat::kCsv); });
  expect_contains(e, "ragged.csv:3");
  expect_contains(e, "3 fields, the header has 2");
  e = error_of([] { all_rows(bad_dir() + "/unclosed.csv", DataFormat::kCsv); });
  expect_contains(e, "unclosed.csv:2");
  expect_contains(e, "not closed");
}

TEST(RowReaderErrors, NotAParquetFile) {
  std::string e = error_of([] { all_rows(files_dir() + "/qa.jsonl", DataFormat::kParquet); });
  expect_contains(e, "qa.jsonl");
  expect_contains(e, "Parquet");
}

TEST(SplitSpec, ParsesHfSliceSyntax) {
  auto s = parse_split("train[:95%]");
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].split, "train");
  EXPECT_FALSE(s[0].from.has_value());
  EXPECT_EQ(*s[0].to, 95);
  EXPECT_TRUE(s[0].percent);
  s = parse_split("train[10:200] + validation");
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(*s[0].from, 10);
  EXPECT_EQ(*s[0].to, 200);
  EXPECT_EQ(s[1].split, "validation");
  s = parse_split("train[-10%:]");
  EXPECT_EQ(*s[0].from, -10);
}

using Range = std::pair<int64_t, int64_t>;

TEST(SplitSpec, ResolvesLikeHfDatasets) {
  // HF rounds percentages to the closest row with Python's round (halves to even).
  EXPECT_EQ(resolve_slice(parse_split("train[:95%]")[0], 12), Range(0, 11));  // 11.4
  EXPECT_EQ(resolve_slice(parse_split("train[:50%]")[0], 5), Range(0, 2));    // 2.5 → 2
  EXPECT_EQ(resolve_slice(parse_split("train[:30%]")[0], 5), Range(0, 2));    // 1.5 → 2
  EXPECT_EQ(resolve_slice(parse_split("train[-25%:]")[0], 12), Range(9, 12));
  EXPECT_EQ(resolve_slice(parse_split("train[-3:]")[0], 12), Range(9, 12));
  EXPECT_EQ(resolve_slice(parse_split("train[10:200]")[0], 50), Range(10, 50));
  EXPECT_EQ(resolve_slice(parse_split("train[:-100]")[0], 50), Range(0, 0));
  EXPECT_EQ(resolve_slice(parse_split("train[:10%](pct1_dropremainder)")[0], 250), Range(0, 20));
}

TEST(SplitSpec, BadExpressionsAreRejectedWithTheKey) {
  for (const char* bad : {"train[", "train[1:x]", "train[5]", "[1:2]", "train[:150%]", "train[1:2](weird)",
                          "train[1:2](closest)", "train + ", "tr ain"}) {
    std::string e = error_of([&] { parse_split(bad); });
    expect_contains(e, "dataset.split");
    expect_contains(e, std::string(bad));
  }
}

TEST(DataFiles, HfShardNamesMakeSplits) {
  DataFiles f = resolve_data_files("parquet", files_dir() + "/hf_repo/data", {});
  ASSERT_EQ(f.splits.size(), 2u);
  EXPECT_EQ(f.splits["train"].size(), 2u);
  EXPECT_EQ(f.splits["validation"].size(), 1u);
  EXPECT_NE(f.splits["train"][0].find("train-00000-of-00002"), std::string::npos);
  // A local folder as the source: the format comes from the files, the README is ignored.
  DataFiles g = resolve_data_files(files_dir() + "/hf_repo", "", {});
  EXPECT_EQ(g.format, DataFormat::kParquet);
  EXPECT_EQ(g.splits["train"].size(), 2u);
}

TEST(DataFiles, GlobsAreRelativeToDataDirAndFormUnnamedTrainSplit) {
  DataFiles f = resolve_data_files("json", files_dir() + "/glob_repo", {"data/train*.jsonl"});
  ASSERT_EQ(f.splits.count("train"), 1u);
  ASSERT_EQ(f.splits["train"].size(), 2u);
  EXPECT_NE(f.splits["train"][0].find("train_a.jsonl"), std::string::npos);
}

// data_files patterns resolve as HF datasets' resolve_pattern does (the expected lists are what
// datasets 4.x returned for this tree): `*` stays inside one folder, `**` spans folders, hidden
// names are skipped, and an absolute pattern walks only below its fixed folders.
TEST(DataFiles, GlobPatternsMatchFolderByFolderAsHfDatasets) {
  const fs::path dir = fs::temp_directory_path() / ("ktune_glob_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  for (const char* f : {"d/a1.jsonl", "d/sub/x1.jsonl", "d/.hidden1.jsonl", "d/.h/y1.jsonl", "d/b2.jsonl"}) {
    fs::create_directories((dir / f).parent_path());
    std::ofstream(dir / f) << "{\"text\": \"x\"}\n";
  }
  auto resolved = [&](const std::string& pattern) {
    std::vector<std::string> out;
    DataFiles files = resolve_data_files("json", dir.string(), {pattern});
    for (const std::string& f : files.splits["train"])
      out.push_back(fs::path(f).lexically_relative(dir).string());
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(resolved("d/*1.jsonl"), (V{"d/a1.jsonl"}));
  EXPECT_EQ(resolved("d/**/*1.jsonl"), (V{"d/a1.jsonl", "d/sub/x1.jsonl"}));
  EXPECT_EQ(resolved((dir / "d/*.jsonl").string()), (V{"d/a1.jsonl", "d/b2.jsonl"}));
  EXPECT_EQ(resolved("d/**"), (V{"d/a1.jsonl", "d/b2.jsonl", "d/sub/x1.jsonl"}));
  EXPECT_EQ(resolved("d/*/*.jsonl"), (V{"d/sub/x1.jsonl"}));
  expect_contains(error_of([&] { resolved("d/*.csv"); }), "no file matches '" + (dir / "d/*.csv").string() + "'");
  fs::remove_all(dir);
}

TEST(DataFilesErrors, MissingSplitEmptySplitAndUnknownSource) {
  DataFiles f = resolve_data_files("parquet", files_dir() + "/hf_repo/data", {});
  auto noop = [](const DataRow&, const RowPlace&) {};
  std::string e = error_of([&] { read_split_rows(f, "test", noop); });
  expect_contains(e, "split 'test' not found");
  expect_contains(e, "train, validation");
  e = error_of([&] { read_split_rows(f, "train[30:]", noop); });
  expect_contains(e, "selects no rows");
  e = error_of([&] { read_split_rows(f, "validation[50%:50%]", noop); });
  expect_contains(e, "selects no rows");
  DataFiles empty = resolve_data_files("json", "", {bad_dir() + "/empty.jsonl"});
  e = error_of([&] { read_split_rows(empty, "train", noop); });
  expect_contains(e, "selects no rows");
  expect_contains(e, "0 rows");
  e = error_of([&] { resolve_data_files("tatsu-lab/alpaca", "", {}); });
  expect_contains(e, "dataset.source");
  expect_contains(e, "tatsu-lab/alpaca");
  e = error_of([&] { resolve_data_files("json", "", {files_dir() + "/nope.jsonl"}); });
  expect_contains(e, "dataset.data_files");
}

}  // namespace
}  // namespace ktune
