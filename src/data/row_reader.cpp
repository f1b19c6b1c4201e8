// The text formats of row_reader.h (JSON, JSONL, CSV, plain text) and the dispatch to the Arrow
// half (arrow_rows.cpp). The CSV reader is a small RFC 4180 state machine rather than a library:
// what matters here is exact line numbers in errors, which general CSV libraries do not give.
#include "data/row_reader.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace ktune {

namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(path, "cannot open the file");
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

void skip_bom(std::string_view& s) {
  if (s.size() >= 3 && (unsigned char)s[0] == 0xEF && (unsigned char)s[1] == 0xBB && (unsigned char)s[2] == 0xBF)
    s.remove_prefix(3);
}

int64_t line_of_offset(std::string_view text, size_t offset) {
  return 1 + (int64_t)std::count(text.begin(), text.begin() + (ptrdiff_t)std::min(offset, text.size()), '\n');
}

// Checks every string inside a parsed value (keys included) for UTF-8; nlohmann accepts what it
// is given from a parsed file only after its own check, but rows also come from CSV and Arrow.
void require_utf8(std::string_view s, const RowPlace& place, const std::string& column) {
  size_t bad = first_invalid_utf8(s);
  if (bad != std::string::npos)
    throw Error(place.where(), "invalid UTF-8 in column '" + column + "' at byte " + std::to_string(bad) + " of the value");
}

std::string parse_error_text(const nlohmann::json::parse_error& e) {
  std::string what = e.what();
  // "[json.exception.parse_error.101] parse error at line 1, column 5: syntax error ..." → after ": "
  size_t p = what.find("parse error");
  return p == std::string::npos ? what : what.substr(p);
}

void read_json_lines(const std::string& path, const RowCallback& on_row) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(path, "cannot open the file");
  std::string line;
  RowPlace place{path, 0, 0};
  int64_t line_no = 0;
  while (std::getline(f, line)) {
    ++line_no;
    std::string_view view(line);
    if (line_no == 1) skip_bom(view);
    if (!view.empty() && view.back() == '\r') view.remove_suffix(1);
    if (view.find_first_not_of(" \t") == std::string_view::npos) continue;  // blank lines carry no row
    place.line = line_no;
    size_t bad = first_invalid_utf8(view);
    if (bad != std::string::npos)
      throw Error(path + ":" + std::to_string(line_no), "invalid UTF-8 at byte " + std::to_string(bad) + " of the line");
    DataRow row;
    try {
      row = DataRow::parse(view);
    } catch (const nlohmann::json::parse_error& e) {
      throw Error(path + ":" + std::to_string(line_no), "malformed JSON line: " + parse_error_text(e));
    }
    if (!row.is_object())
      throw Error(path + ":" + std::to_string(line_no), std::string("expected a JSON object per line, got ") + row.type_name());
    on_row(row, place);
    ++place.row;
  }
}

void read_json(const std::string& path, const RowCallback& on_row) {
  std::string text = read_file(path);
  std::string_view view(text);
  skip_bom(view);
  size_t first = view.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) return;  // an empty file has no rows
  if (view[first] != '[') return read_json_lines(path, on_row);
  size_t bad = first_invalid_utf8(view);
  if (bad != std::string::npos)
    throw Error(path + ":" + std::to_string(line_of_offset(view, bad)), "invalid UTF-8 at byte " + std::to_string(bad) + " of the file");
  DataRow array;
  try {
    array = DataRow::parse(view);
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(path + ":" + std::to_string(line_of_offset(view, e.byte == 0 ? 0 : e.byte - 1)), "malformed JSON: " + parse_error_text(e));
  }
  RowPlace place{path, 0, 0};
  for (const DataRow& row : array) {
    if (!row.is_object())
      throw Error(path + ": element " + std::to_string(place.row), std::string("expected a JSON object per array element, got ") + row.type_name());
    on_row(row, place);
    ++place.row;
  }
}

// RFC 4180 with a header row. Fields are strings; a row must have as many fields as the header.
void read_csv(const std::string& path, const RowCallback& on_row) {
  std::string text = read_file(path);
  std::string_view s(text);
  skip_bom(s);
  std::vector<std::string> header;
  std::vector<std::string> fields;
  std::string field;
  int64_t line = 1, record_line = 1;
  RowPlace place{path, 0, 0};
  size_t i = 0;
  bool at_record_start = true;
  auto finish_record = [&]() {
    if (header.empty()) {
      header = fields;
      for (size_t c = 0; c < header.size(); ++c) {
        RowPlace hp{path, -1, record_line};
        require_utf8(header[c], hp, "header");
      }
    } else {
      place.line = record_line;
      if (fields.size() == 1 && fields[0].empty() && header.size() != 1) return;  // a blank line
      if (fields.size() != header.size())
        throw Error(path + ":" + std::to_string(record_line),
                    "CSV row has " + std::to_string(fields.size()) + " fields, the header has " + std::to_string(header.size()));
      DataRow row = DataRow::object();
      for (size_t c = 0; c < header.size(); ++c) {
        require_utf8(fields[c], place, header[c]);
        row[header[c]] = std::move(fields[c]);
      }
      on_row(row, place);
      ++place.row;
    }
  };
  while (i < s.size()) {
    if (at_record_start) { record_line = line; at_record_start = false; fields.clear(); }
    field.clear();
    if (s[i] == '"') {  // quoted field
      ++i;
      while (true) {
        if (i >= s.size()) throw Error(path + ":" + std::to_string(record_line), "CSV quoted field is not closed before the end of the file");
        char c = s[i];
        if (c == '"') {
          if (i + 1 < s.size() && s[i + 1] == '"') { field += '"'; i += 2; continue; }
          ++i;
          break;
        }
        if (c == '\n') ++line;
        field += c;
        ++i;
      }
      if (i < s.size() && s[i] != ',' && s[i] != '\n' && s[i] != '\r')
        throw Error(path + ":" + std::to_string(line), "CSV: unexpected character after a closing quote");
    } else {
      while (i < s.size() && s[i] != ',' && s[i] != '\n' && s[i] != '\r') field += s[i++];
    }
    fields.push_back(field);
    if (i >= s.size()) { finish_record(); break; }
    if (s[i] == ',') { ++i; if (i >= s.size()) { fields.emplace_back(); finish_record(); } continue; }
    if (s[i] == '\r') ++i;
    if (i < s.size() && s[i] == '\n') ++i;
    ++line;
    finish_record();
    at_record_start = true;
  }
  if (header.empty()) return;
}

void read_text(const std::string& path, const RowCallback& on_row) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(path, "cannot open the file");
  std::string line;
  RowPlace place{path, 0, 0};
  while (std::getline(f, line)) {
    place.line = place.row + 1;
    std::string_view view(line);
    if (place.row == 0) skip_bom(view);
    if (!view.empty() && view.back() == '\r') view.remove_suffix(1);
    require_utf8(view, place, "text");
    DataRow row = DataRow::object();
    row["text"] = std::string(view);
    on_row(row, place);
    ++place.row;
  }
}

}  // namespace

DataFormat parse_data_format(const std::string& name) {
  if (name == "json" || name == "jsonl") return DataFormat::kJson;
  if (name == "csv") return DataFormat::kCsv;
  if (name == "parquet") return DataFormat::kParquet;
  if (name == "arrow") return DataFormat::kArrow;
  if (name == "text" || name == "txt") return DataFormat::kText;
  throw Error("dataset.source", "unknown data format '" + name + "'; expected json, csv, parquet, arrow or text");
}

std::string data_format_name(DataFormat format) {
  switch (format) {
    case DataFormat::kJson: return "json";
    case DataFormat::kCsv: return "csv";
    case DataFormat::kParquet: return "parquet";
    case DataFormat::kArrow: return "arrow";
    case DataFormat::kText: return "text";
  }
  return "json";
}

bool data_format_from_path(const std::string& path, DataFormat* format) {
  auto ends = [&](const char* ext) {
    std::string e(ext);
    return path.size() >= e.size() && path.compare(path.size() - e.size(), e.size(), e) == 0;
  };
  if (ends(".json") || ends(".jsonl")) { *format = DataFormat::kJson; return true; }
  if (ends(".csv")) { *format = DataFormat::kCsv; return true; }
  if (ends(".parquet")) { *format = DataFormat::kParquet; return true; }
  if (ends(".arrow")) { *format = DataFormat::kArrow; return true; }
  if (ends(".txt")) { *format = DataFormat::kText; return true; }
  return false;
}

std::string RowPlace::where() const {
  std::string w = file;
  if (row >= 0) w += ": row " + std::to_string(row);
  if (line > 0) w += " (line " + std::to_string(line) + ")";
  return w;
}

void read_rows(const std::string& path, DataFormat format, const RowCallback& on_row) {
  switch (format) {
    case DataFormat::kJson: return read_json(path, on_row);
    case DataFormat::kCsv: return read_csv(path, on_row);
    case DataFormat::kText: return read_text(path, on_row);
    case DataFormat::kParquet:
    case DataFormat::kArrow: return read_arrow_rows(path, format, on_row);
  }
}

int64_t count_rows(const std::string& path, DataFormat format) {
  if (format == DataFormat::kParquet || format == DataFormat::kArrow) return count_arrow_rows(path, format);
  int64_t n = 0;
  read_rows(path, format, [&](const DataRow&, const RowPlace&) { ++n; });
  return n;
}

size_t first_invalid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    unsigned char c = p[i];
    if (c < 0x80) { ++i; continue; }
    int len;
    unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c == 0xE0) { len = 3; lo = 0xA0; }
    else if (c >= 0xE1 && c <= 0xEC) len = 3;
    else if (c == 0xED) { len = 3; hi = 0x9F; }  // no surrogates
    else if (c >= 0xEE && c <= 0xEF) len = 3;
    else if (c == 0xF0) { len = 4; lo = 0x90; }
    else if (c >= 0xF1 && c <= 0xF3) len = 4;
    else if (c == 0xF4) { len = 4; hi = 0x8F; }
    else return i;
    if (i + len > n) return i;
    if (p[i + 1] < lo || p[i + 1] > hi) return i;
    for (int k = 2; k < len; ++k)
      if ((p[i + k] & 0xC0) != 0x80) return i;
    i += len;
  }
  return std::string::npos;
}

}  // namespace ktune
