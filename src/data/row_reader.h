// Reading dataset files row by row: JSON (an array of objects, or one object a line), JSONL,
// CSV (RFC 4180: a header row, quoted fields with "" escapes and embedded newlines, CRLF),
// Parquet and Arrow IPC (file or stream format, as HF `datasets` writes .arrow files) through
// Apache Arrow C++, and plain text (one row {"text": line} a line, as HF's text loader).
// Every row is handed over as a JSON object (column → string, number, bool, null, list, object)
// whose keys keep the file's order (the columns', and a JSON object's own, as HF datasets and
// Python keep them: a chat template's tojson of a tool call's arguments writes them in that order),
// together with its place (file, row, line), so that builders and errors see one shape whatever
// the format. Strings are checked to be UTF-8; a bad one is reported with its file and row.
//
// Rows are streamed: one file, and for Parquet one row group, is in memory at a time (a JSON
// array file is parsed whole). Deliberately not here: choosing files (data_files.h), splits,
// columns, tokens.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

namespace ktune {

enum class DataFormat { kJson, kCsv, kParquet, kArrow, kText };

// "json" (also "jsonl"), "csv", "parquet", "arrow", "text". Throws ktune::Error otherwise.
DataFormat parse_data_format(const std::string& name);
std::string data_format_name(DataFormat format);
// From a file name's extension (.json .jsonl .csv .parquet .arrow .txt); false when unknown.
bool data_format_from_path(const std::string& path, DataFormat* format);

// One row: ordered keys (nlohmann::ordered_json), see above.
using DataRow = nlohmann::ordered_json;

struct RowPlace {
  std::string file;
  int64_t row = 0;   // 0-based within the file
  int64_t line = 0;  // 1-based line where the row starts, 0 where lines mean nothing (Parquet)
  std::string where() const;  // "data.csv: row 3 (line 5)"
};

using RowCallback = std::function<void(const DataRow& row, const RowPlace& place)>;

// Calls on_row for each row of the file in order. Throws ktune::Error naming the file and line
// (malformed JSON, a CSV row with the wrong number of fields, invalid UTF-8, an unreadable file).
void read_rows(const std::string& path, DataFormat format, const RowCallback& on_row);
// The number of rows read_rows would produce (Parquet and Arrow from metadata, others by reading).
int64_t count_rows(const std::string& path, DataFormat format);

// Arrow/Parquet halves, in arrow_rows.cpp.
void read_arrow_rows(const std::string& path, DataFormat format, const RowCallback& on_row);
int64_t count_arrow_rows(const std::string& path, DataFormat format);

// The byte offset of the first byte that is not well-formed UTF-8 (overlongs, surrogates and
// code points above U+10FFFF included), or std::string::npos.
size_t first_invalid_utf8(std::string_view s);

}  // namespace ktune
