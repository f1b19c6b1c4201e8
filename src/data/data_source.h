// Where a dataset's rows come from, with the meaning torchtune users know from HF
// `load_dataset(source, data_dir=…, data_files=…, split=…)`:
//   - source is a format ("json", "csv", "parquet", "arrow", "text") read from data_files and/or
//     data_dir, or a local file, or a local folder (format taken from the files' extensions);
//   - files in a folder are assigned to splits by HF's naming rules (a path word "train" or
//     "training" → train; "validation", "valid", "val", "dev" → validation; "test", "testing",
//     "eval", "evaluation" → test; e.g. train-00000-of-00001.parquet, data/train*.parquet,
//     train/part0.json). When no file names a split, all files are "train". Explicit data_files
//     are the "train" split. Files are read in sorted order;
//   - split is HF's slice syntax: train, train[:95%], train[10:200], train[-10%:], train[50%:],
//     train[:10%](pct1_dropremainder), and '+' to concatenate (train[:10]+validation).
//     Percentages round to the closest row (Python's round: halves to even), as HF does.
// Deliberately not here: the Hugging Face Hub (ktune reads local files; the initializer or
// `ktune download` fetches them), row contents, tokens.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "data/row_reader.h"

namespace ktune {

struct SplitSlice {
  std::string split;               // "train"
  std::optional<int64_t> from, to;  // as written; negative counts from the end
  bool percent = false;             // from/to are percentages
  bool pct1_dropremainder = false;  // HF's other rounding: floor(pct * n / 100)
};

// Parses "train[:95%]+test[10:]". Throws ktune::Error("dataset.split", …) on a bad expression.
std::vector<SplitSlice> parse_split(const std::string& expression);
// [begin, end) rows of a split with num_rows rows (HF's _rel_to_abs_instr).
std::pair<int64_t, int64_t> resolve_slice(const SplitSlice& slice, int64_t num_rows);

struct DataFiles {
  DataFormat format = DataFormat::kJson;
  std::map<std::string, std::vector<std::string>> splits;  // split name → files, sorted
  std::string description;  // for errors: "parquet files in /workspace/dataset/data"
};

// Resolves source / data_dir / data_files to files per split. Throws ktune::Error naming the key
// (dataset.source, dataset.data_dir, dataset.data_files) when nothing usable is found.
DataFiles resolve_data_files(const std::string& source, const std::string& data_dir,
                             const std::vector<std::string>& data_files);

// Streams the rows the split expression selects, in order; index is the row's position within
// its split. Throws when a split is missing (listing those that exist) or selects no rows.
void read_split_rows(const DataFiles& files, const std::string& split_expression,
                     const std::function<void(const DataRow& row, const RowPlace& place)>& on_row);

}  // namespace ktune
