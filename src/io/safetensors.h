// safetensors files: read through mmap (zero-copy views of F32/BF16/F16/I32/I64/U8 tensors, or f32
// copies on request), sharded checkpoints through `model.safetensors.index.json`, and writes that
// are atomic (temp file in the same directory, fsync, rename) with optional sharding by size under
// Hugging Face's names (`model-00001-of-00002.safetensors` + the index).
// Every header is validated before any tensor is touched: header length against the file size,
// well-formed JSON, known dtypes, shapes, offsets inside the data buffer, sizes equal to
// numel * element size, no two tensors overlapping. A bad file is a ktune::Error naming the file
// (and the tensor), never a read out of bounds.
// It deliberately does not convert between names (model/ maps HF names), does not write dtypes that
// core's Tensor lacks, and never modifies a file in place.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace ktune {
class AtomicFile;  // core/atomic_file.h
}  // namespace ktune

namespace ktune::io {

// One tensor as a header describes it. dtype is the safetensors name ("F32", "BF16", ...).
struct SafetensorsInfo {
  std::string name;
  std::string dtype;
  Shape shape;
  uint64_t begin = 0, end = 0;  // [begin, end) relative to the data buffer
};

// The ktune DType for a safetensors dtype name; false when core has no such type (F64, I8, F8_*...).
bool safetensors_dtype_to_ktune(const std::string& name, DType* out);
const char* ktune_dtype_to_safetensors(DType dtype);  // throws for NF4

class SafetensorsFile {
 public:
  // Maps and validates the file. Throws ktune::Error naming the file (and tensor) on any fault.
  static SafetensorsFile open(const std::string& path);

  const std::string& path() const { return path_; }
  const std::vector<std::string>& names() const { return names_; }  // in data order
  bool contains(const std::string& name) const { return infos_.count(name) != 0; }
  const SafetensorsInfo& info(const std::string& name) const;  // throws when absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // The tensor in its stored dtype, sharing the mapping (copied only when the data is misaligned
  // for its element type). Throws for dtypes core's Tensor lacks.
  Tensor view(const std::string& name) const;
  // Where the tensor's bytes lie in the mapping (a view() shares it unless it had to copy).
  const void* address(const std::string& name) const { return data_ + info(name).begin; }
  // A new f32 tensor converted from F32, BF16 or F16.
  Tensor to_f32(const std::string& name) const;
  // Drops the tensor's whole pages from this process's resident memory (madvise DONTNEED on the
  // read-only mapping: they stay in the page cache, and a later read faults them in again from the
  // file, unchanged). A loader that has copied a tensor out calls it, so that a model being loaded
  // is not resident twice, once mapped and once copied.
  void release_pages(const std::string& name) const;

 private:
  std::string path_;
  std::shared_ptr<void> mapping_;  // munmaps when the last view is gone
  const uint8_t* data_ = nullptr;  // start of the data buffer
  uint64_t data_bytes_ = 0;
  std::vector<std::string> names_;
  std::map<std::string, SafetensorsInfo> infos_;
  std::map<std::string, std::string> metadata_;
};

// A checkpoint made of one file or of shards: opened from a .safetensors file, from an index
// .json, or from a directory holding `model.safetensors.index.json` or `model.safetensors`.
class SafetensorsCheckpoint {
 public:
  static SafetensorsCheckpoint open(const std::string& path);

  const std::vector<std::string>& names() const { return names_; }  // sorted
  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  const SafetensorsFile& file_of(const std::string& name) const;  // throws naming the checkpoint
  const SafetensorsInfo& info(const std::string& name) const { return file_of(name).info(name); }
  Tensor view(const std::string& name) const { return file_of(name).view(name); }
  Tensor to_f32(const std::string& name) const { return file_of(name).to_f32(name); }
  const std::string& path() const { return path_; }
  size_t num_files() const { return files_.size(); }

 private:
  std::string path_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t> where_;
  std::vector<std::string> names_;
};

struct NamedTensor {
  std::string name;
  Tensor tensor;  // CPU; F32, BF16, F16, I32, I64 or U8
};

// Writes one file atomically. Names must be unique and non-empty, and not "__metadata__".
void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// A tensor of a file being planned: its name, dtype and shape (its place in the header).
struct TensorSpec {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
};

// Takes tensors by name, one call each: the consumer of a producer that streams them (a GPU run's
// trainable values, downloaded unit by unit as a checkpoint is written).
using TensorSink = std::function<void(const std::string& name, const Tensor& tensor)>;


// A safetensors file written by position: planned whole when opened (names, dtypes and shapes, in
// the given order: its header and the place of every tensor's bytes), then filled one tensor at a
// time in any order, each exactly once, and committed atomically (a temporary file beside the path,
// fsync, rename) once every tensor is in. The file is byte for byte the one write_safetensors
// writes for the same tensors in the planned order, whatever order they arrive in. Destroyed
// without commit() (a failed save), the temporary file is removed and `path` left as it was.
class SafetensorsWriter {
 public:
  SafetensorsWriter(std::string path, const std::vector<TensorSpec>& tensors,
                    const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  const std::string& path() const { return path_; }
  bool holds(const std::string& name) const { return slots_.count(name) != 0; }
  const TensorSpec& spec(const std::string& name) const;  // Error naming the file when not planned
  // A CPU tensor of the planned dtype and shape, at its place. Errors name the file and the tensor:
  // a name not planned, one written already, another dtype or shape.
  void write(const std::string& name, const Tensor& tensor);
  // Into place; an Error naming the first planned tensor not written (the file is then not made).
  void commit();

 private:
  struct Slot {
    TensorSpec spec;
    uint64_t offset = 0;  // of its bytes in the file
    bool written = false;
  };
  std::string path_;
  std::unique_ptr<AtomicFile> file_;
  std::vector<std::string> order_;  // the planned order
  std::map<std::string, Slot> slots_;
};

// A tensor to be written whose bytes are made only when the writer reaches it.
struct PlannedTensor {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  std::function<Tensor()> produce;  // a CPU tensor of that dtype and shape
};

// A tensor already made, planned as itself (sharing its storage); a map's, in the map's order.
PlannedTensor planned_as_it_is(const std::string& name, const Tensor& tensor);
std::vector<PlannedTensor> planned_as_they_are(const std::map<std::string, Tensor>& tensors);

// write_safetensors, producing each tensor as it is written and dropping it before the next, so that
// one tensor at a time is held (a checkpoint's merged model: each merged projection made, written,
// freed). A produced tensor of another dtype or shape than planned is an Error naming it.
void write_safetensors_streamed(const std::string& path, const std::vector<PlannedTensor>& tensors,
                                const std::map<std::string, std::string>& metadata = {});

// Writes `dir/<prefix>.safetensors` when everything fits in max_shard_bytes, else shards
// `dir/<prefix>-0000k-of-0000n.safetensors` (tensors in the given order, a new shard when the next
// tensor would overflow; a tensor larger than the limit gets a shard of its own) plus
// `dir/<prefix>.safetensors.index.json`. Returns the file names written (index last).
std::vector<std::string> write_safetensors_sharded(const std::string& dir, const std::vector<NamedTensor>& tensors,
                                                   uint64_t max_shard_bytes,
                                                   const std::map<std::string, std::string>& metadata = {},
                                                   const std::string& prefix = "model");

}  // namespace ktune::io
