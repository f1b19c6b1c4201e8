#include "train/tensorboard_events.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace ktune {

namespace {

// The reflected CRC-32C table (polynomial 0x82F63B78), one entry a byte value.
const std::array<uint32_t, 256>& crc32c_table() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  return table;
}

// ---- protobuf wire format: the few shapes an Event needs -----------------------------------------

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(char(uint8_t(v) | 0x80));
    v >>= 7;
  }
  out.push_back(char(uint8_t(v)));
}

void put_key(std::string& out, int field, int wire_type) { put_varint(out, uint64_t(field) << 3 | uint64_t(wire_type)); }

template <typename T>
void put_little_endian(std::string& out, T value) {  // host is little-endian (x86-64, aarch64)
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  out.append(bytes, sizeof(T));
}

void put_bytes(std::string& out, int field, const std::string& bytes) {  // wire type 2: length-delimited
  put_key(out, field, 2);
  put_varint(out, bytes.size());
  out += bytes;
}

void put_double(std::string& out, int field, double v) {  // wire type 1: 64-bit
  put_key(out, field, 1);
  put_little_endian(out, v);
}

// Event { double wall_time = 1; int64 step = 2; ... } with the rest appended by the caller.
std::string event_head(double wall_time, int64_t step) {
  std::string event;
  put_double(event, 1, wall_time);
  if (step != 0) {  // proto3 leaves a zero out
    put_key(event, 2, 0);
    put_varint(event, uint64_t(step));
  }
  return event;
}

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  const auto& table = crc32c_table();
  const auto* bytes = static_cast<const uint8_t*>(data);
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ bytes[i]) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t crc = crc32c(data, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string tensorboard_event_file_name(int64_t unix_seconds) {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%010lld", static_cast<long long>(unix_seconds));
  return std::string("events.out.tfevents.") + seconds + "." + host + "." + std::to_string(getpid()) + ".0";
}

TensorBoardEventWriter::TensorBoardEventWriter(const std::string& path, double wall_time) : path_(path) {
  file_ = std::fopen(path.c_str(), "wb");
  if (file_ == nullptr) throw Error(path, std::string("cannot create the TensorBoard event file: ") + std::strerror(errno));
  // Event { wall_time, file_version = 3: "brain.Event:2", source_metadata = 10: { writer = 1 } }
  std::string event = event_head(wall_time, 0);
  put_bytes(event, 3, "brain.Event:2");
  std::string source;
  put_bytes(source, 1, "ktune");
  put_bytes(event, 10, source);
  write_record(event);
}

TensorBoardEventWriter::~TensorBoardEventWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void TensorBoardEventWriter::add_scalar(const std::string& tag, double value, int64_t step, double wall_time) {
  // TensorProto { dtype = 1: DT_FLOAT (1); float_val = 5: packed [value] }
  std::string tensor;
  put_key(tensor, 1, 0);
  put_varint(tensor, 1);
  std::string floats;
  put_little_endian(floats, static_cast<float>(value));
  put_bytes(tensor, 5, floats);
  // SummaryMetadata { plugin_data = 1: { plugin_name = 1: "scalars" } }
  std::string plugin;
  put_bytes(plugin, 1, "scalars");
  std::string metadata;
  put_bytes(metadata, 1, plugin);
  // Summary.Value { tag = 1; tensor = 8; metadata = 9 }, in Summary { value = 1 }
  std::string summary_value;
  put_bytes(summary_value, 1, tag);
  put_bytes(summary_value, 8, tensor);
  put_bytes(summary_value, 9, metadata);
  std::string summary;
  put_bytes(summary, 1, summary_value);
  std::string event = event_head(wall_time, step);
  put_bytes(event, 5, summary);
  write_record(event);
}

void TensorBoardEventWriter::write_record(const std::string& event) {
  std::string record;
  put_little_endian(record, uint64_t(event.size()));
  const uint32_t length_crc = masked_crc32c(record.data(), record.size());
  put_little_endian(record, length_crc);
  record += event;
  put_little_endian(record, masked_crc32c(event.data(), event.size()));
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size() || std::fflush(file_) != 0)
    throw Error(path_, std::string("cannot write the TensorBoard event file: ") + std::strerror(errno));
}

}  // namespace ktune
