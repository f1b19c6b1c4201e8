// TensorBoard's event files, written natively: what torchtune's TensorBoardLogger writes through
// torch.utils.tensorboard.SummaryWriter, byte for byte for the same values and times.
//
// A file is a sequence of TFRecords: u64 length, u32 masked CRC-32C of the length, the bytes, u32
// masked CRC-32C of the bytes (little-endian). Each record is one `Event` protobuf: the first says
// the file's version ("brain.Event:2"); each scalar after it is an Event with the step and a
// Summary holding one value in the "new style" torch writes with new_style=True (a DT_FLOAT tensor
// and the "scalars" plugin's metadata), which TensorBoard reads fastest.
// The protobuf encoding is done by hand (a few fields; no protobuf library needed).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace ktune {

// CRC-32C (Castagnoli) of bytes, and TFRecord's mask of it: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t crc32c(const void* data, size_t n);
uint32_t masked_crc32c(const void* data, size_t n);

// TensorBoard's file name for an event file opened at `unix_seconds`:
// events.out.tfevents.<%010d seconds>.<hostname>.<pid>.0 (SummaryWriter's first writer of a process).
std::string tensorboard_event_file_name(int64_t unix_seconds);

class TensorBoardEventWriter {
 public:
  // Creates `path` (truncating) and writes the file-version event stamped `wall_time` (seconds).
  TensorBoardEventWriter(const std::string& path, double wall_time);
  ~TensorBoardEventWriter();
  TensorBoardEventWriter(const TensorBoardEventWriter&) = delete;
  TensorBoardEventWriter& operator=(const TensorBoardEventWriter&) = delete;

  // One scalar event: `tag` at `step`, the value as a float32 (as torch's writer stores it). Flushed,
  // so that a killed run keeps every event it wrote and TensorBoard sees it while the run goes on.
  void add_scalar(const std::string& tag, double value, int64_t step, double wall_time);

  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& event);

  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace ktune
