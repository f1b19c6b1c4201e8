// Parquet and Arrow IPC rows through Apache Arrow C++ (the libraries the pyarrow wheel ships,
// target ktune::arrow): a record batch at a time, each row turned into the JSON object the
// builders read. Arrow IPC comes in two framings, the file format (magic "ARROW1", what
// pyarrow.ipc.new_file writes) and the stream format (what HF `datasets` stores as .arrow);
// both are read. Deliberately no hand-written decoding of either format.
#include <arrow/api.h>
#include <arrow/io/file.h>
#include <arrow/ipc/reader.h>
#include <parquet/arrow/reader.h>
#include <parquet/exception.h>

#include <fstream>

#include "core/error.h"
#include "data/row_reader.h"

namespace ktune {

namespace {

template <typename T>
T unwrap(arrow::Result<T> result, const std::string& where, const char* what) {
  if (!result.ok()) throw Error(where, std::string(what) + ": " + result.status().ToString());
  return std::move(result).ValueUnsafe();
}

void require_ok(const arrow::Status& status, const std::string& where, const char* what) {
  if (!status.ok()) throw Error(where, std::string(what) + ": " + status.ToString());
}

DataRow string_value(std::string_view s, const RowPlace& place, const std::string& column) {
  size_t bad = first_invalid_utf8(s);
  if (bad != std::string::npos)
    throw Error(place.where(), "invalid UTF-8 in column '" + column + "' at byte " + std::to_string(bad) + " of the value");
  return std::string(s);
}

DataRow to_json(const arrow::Array& array, int64_t i, const RowPlace& place, const std::string& column);

template <typename ListArray>
DataRow list_value(const arrow::Array& array, int64_t i, const RowPlace& place, const std::string& column) {
  const auto& list = static_cast<const ListArray&>(array);
  DataRow out = DataRow::array();
  const arrow::Array& values = *list.values();
  for (int64_t k = list.value_offset(i); k < list.value_offset(i) + list.value_length(i); ++k)
    out.push_back(to_json(values, k, place, column));
  return out;
}

DataRow to_json(const arrow::Array& array, int64_t i, const RowPlace& place, const std::string& column) {
  if (array.IsNull(i)) return nullptr;
  switch (array.type_id()) {
    case arrow::Type::BOOL: return static_cast<const arrow::BooleanArray&>(array).Value(i);
    case arrow::Type::INT8: return static_cast<const arrow::Int8Array&>(array).Value(i);
    case arrow::Type::INT16: return static_cast<const arrow::Int16Array&>(array).Value(i);
    case arrow::Type::INT32: return static_cast<const arrow::Int32Array&>(array).Value(i);
    case arrow::Type::INT64: return static_cast<const arrow::Int64Array&>(array).Value(i);
    case arrow::Type::UINT8: return static_cast<const arrow::UInt8Array&>(array).Value(i);
    case arrow::Type::UINT16: return static_cast<const arrow::UInt16Array&>(array).Value(i);
    case arrow::Type::UINT32: return static_cast<const arrow::UInt32Array&>(array).Value(i);
    case arrow::Type::UINT64: return static_cast<const arrow::UInt64Array&>(array).Value(i);
    case arrow::Type::FLOAT: return static_cast<const arrow::FloatArray&>(array).Value(i);
    case arrow::Type::DOUBLE: return static_cast<const arrow::DoubleArray&>(array).Value(i);
    case arrow::Type::STRING: return string_value(static_cast<const arrow::StringArray&>(array).GetView(i), place, column);
    case arrow::Type::LARGE_STRING:
      return string_value(static_cast<const arrow::LargeStringArray&>(array).GetView(i), place, column);
    case arrow::Type::STRING_VIEW:
      return string_value(static_cast<const arrow::StringViewArray&>(array).GetView(i), place, column);
    case arrow::Type::LIST: return list_value<arrow::ListArray>(array, i, place, column);
    case arrow::Type::LARGE_LIST: return list_value<arrow::LargeListArray>(array, i, place, column);
    case arrow::Type::FIXED_SIZE_LIST: return list_value<arrow::FixedSizeListArray>(array, i, place, column);
    case arrow::Type::STRUCT: {
      const auto& st = static_cast<const arrow::StructArray&>(array);
      DataRow out = DataRow::object();
      for (int f = 0; f < st.num_fields(); ++f)
        out[st.type()->field(f)->name()] = to_json(*st.field(f), i, place, column);
      return out;
    }
    case arrow::Type::DICTIONARY: {
      const auto& d = static_cast<const arrow::DictionaryArray&>(array);
      return to_json(*d.dictionary(), d.GetValueIndex(i), place, column);
    }
    default:
      throw Error(place.where(), "column '" + column + "' has Arrow type " + array.type()->ToString() +
                                     ", which ktune cannot read as text (strings, numbers, lists and structs are read)");
  }
}

void emit_batch(const arrow::RecordBatch& batch, RowPlace& place, const RowCallback& on_row) {
  const auto& schema = *batch.schema();
  for (int64_t r = 0; r < batch.num_rows(); ++r) {
    DataRow row = DataRow::object();
    for (int c = 0; c < batch.num_columns(); ++c) {
      const std::string& name = schema.field(c)->name();
      row[name] = to_json(*batch.column(c), r, place, name);
    }
    on_row(row, place);
    ++place.row;
  }
}

bool has_file_magic(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  char magic[6] = {};
  f.read(magic, 6);
  return f.gcount() == 6 && std::string(magic, 6) == "ARROW1";
}

std::shared_ptr<arrow::io::ReadableFile> open_file(const std::string& path) {
  return unwrap(arrow::io::ReadableFile::Open(path), path, "cannot open the file");
}

}  // namespace

void read_arrow_rows(const std::string& path, DataFormat format, const RowCallback& on_row) {
  RowPlace place{path, 0, 0};
  try {
    auto file = open_file(path);
    if (format == DataFormat::kParquet) {
      auto reader = unwrap(parquet::arrow::OpenFile(file, arrow::default_memory_pool()), path, "not a readable Parquet file");
      auto batches = unwrap(reader->GetRecordBatchReader(), path, "cannot read the Parquet row groups");
      while (true) {
        std::shared_ptr<arrow::RecordBatch> batch;
        require_ok(batches->ReadNext(&batch), path, "cannot read a Parquet row group");
        if (!batch) break;
        emit_batch(*batch, place, on_row);
      }
    } else if (has_file_magic(path)) {
      auto reader = unwrap(arrow::ipc::RecordBatchFileReader::Open(file), path, "not a readable Arrow IPC file");
      for (int b = 0; b < reader->num_record_batches(); ++b) {
        auto batch = unwrap(reader->ReadRecordBatch(b), path, "cannot read an Arrow record batch");
        emit_batch(*batch, place, on_row);
      }
    } else {
      auto reader = unwrap(arrow::ipc::RecordBatchStreamReader::Open(file), path, "not a readable Arrow IPC file or stream");
      while (true) {
        std::shared_ptr<arrow::RecordBatch> batch;
        require_ok(reader->ReadNext(&batch), path, "cannot read an Arrow record batch");
        if (!batch) break;
        emit_batch(*batch, place, on_row);
      }
    }
  } catch (const parquet::ParquetException& e) {
    throw Error(path, std::string("not a readable Parquet file: ") + e.what());
  }
}

int64_t count_arrow_rows(const std::string& path, DataFormat format) {
  try {
    auto file = open_file(path);
    if (format == DataFormat::kParquet) {
      auto reader = unwrap(parquet::arrow::OpenFile(file, arrow::default_memory_pool()), path, "not a readable Parquet file");
      return reader->parquet_reader()->metadata()->num_rows();
    }
    if (has_file_magic(path)) {
      auto reader = unwrap(arrow::ipc::RecordBatchFileReader::Open(file), path, "not a readable Arrow IPC file");
      return unwrap(reader->CountRows(), path, "cannot count the Arrow rows");
    }
    auto reader = unwrap(arrow::ipc::RecordBatchStreamReader::Open(file), path, "not a readable Arrow IPC file or stream");
    int64_t n = 0;
    while (true) {
      std::shared_ptr<arrow::RecordBatch> batch;
      require_ok(reader->ReadNext(&batch), path, "cannot read an Arrow record batch");
      if (!batch) break;
      n += batch->num_rows();
    }
    return n;
  } catch (const parquet::ParquetException& e) {
    throw Error(path, std::string("not a readable Parquet file: ") + e.what());
  }
}

}  // namespace ktune
