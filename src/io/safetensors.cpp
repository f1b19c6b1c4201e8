// safetensors reading (mmap + validation) and atomic, optionally sharded, writing. See safetensors.h.
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/free_space.h"

namespace ktune::io {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the limit the reference implementation uses

struct DTypeRow {
  const char* name;
  int bytes;
  bool has_ktune;
  DType ktune;
};

constexpr DTypeRow kDTypes[] = {
    {"BOOL", 1, false, DType::U8},  {"U8", 1, true, DType::U8},       {"I8", 1, false, DType::U8},
    {"I16", 2, false, DType::U8},   {"U16", 2, false, DType::U8},     {"F16", 2, true, DType::F16},
    {"BF16", 2, true, DType::BF16}, {"I32", 4, true, DType::I32},     {"U32", 4, false, DType::U8},
    {"F32", 4, true, DType::F32},   {"F64", 8, false, DType::U8},     {"I64", 8, true, DType::I64},
    {"U64", 8, false, DType::U8},   {"F8_E4M3", 1, false, DType::U8}, {"F8_E5M2", 1, false, DType::U8},
};

const DTypeRow* find_dtype(const std::string& name) {
  for (const DTypeRow& row : kDTypes)
    if (name == row.name) return &row;
  return nullptr;
}

std::string errno_text() { return std::strerror(errno); }

// a * b, or false on overflow of uint64.
bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) {
  if (a != 0 && b > std::numeric_limits<uint64_t>::max() / a) return true;
  *out = a * b;
  return false;
}

}  // namespace

bool safetensors_dtype_to_ktune(const std::string& name, DType* out) {
  const DTypeRow* row = find_dtype(name);
  if (!row || !row->has_ktune) return false;
  *out = row->ktune;
  return true;
}

const char* ktune_dtype_to_safetensors(DType dtype) {
  switch (dtype) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::U8: return "U8";
    default: throw Error("safetensors", std::string("no safetensors dtype for ") + dtype_name(dtype));
  }
}

// ---------------------------------------------------------------------------------------------
// Reading

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  f.path_ = path;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(path, "cannot open: " + errno_text());
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    std::string why = errno_text();
    ::close(fd);
    throw Error(path, "cannot stat: " + why);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(path, "not a regular file");
  }
  const uint64_t file_size = uint64_t(st.st_size);
  if (file_size < 8) {
    ::close(fd);
    throw Error(path, "truncated: " + std::to_string(file_size) + " bytes, fewer than the 8-byte header length");
  }
  void* base = mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) throw Error(path, "cannot mmap: " + errno_text());
  f.mapping_ = std::shared_ptr<void>(base, [file_size](void* p) { munmap(p, file_size); });
  const uint8_t* bytes = static_cast<const uint8_t*>(base);

  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];  // little-endian
  if (header_len > kMaxHeaderBytes)
    throw Error(path, "header length " + std::to_string(header_len) + " exceeds the 100 MiB limit");
  if (header_len > file_size - 8)
    throw Error(path, "truncated: header length " + std::to_string(header_len) + " but only " +
                          std::to_string(file_size - 8) + " bytes follow");
  f.data_ = bytes + 8 + header_len;
  f.data_bytes_ = file_size - 8 - header_len;

  json header;
  try {
    header = json::parse(reinterpret_cast<const char*>(bytes + 8), reinterpret_cast<const char*>(bytes + 8 + header_len));
  } catch (const json::exception& e) {
    throw Error(path, std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) throw Error(path, "header is not a JSON object");

  std::vector<SafetensorsInfo> infos;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) throw Error(path, "__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) throw Error(path, "__metadata__ value of '" + m.key() + "' is not a string");
        f.metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = path + ": tensor " + name;
    if (!v.is_object()) throw Error(where, "entry is not an object");
    if (!v.contains("dtype") || !v["dtype"].is_string()) throw Error(where, "missing string 'dtype'");
    if (!v.contains("shape") || !v["shape"].is_array()) throw Error(where, "missing array 'shape'");
    if (!v.contains("data_offsets") || !v["data_offsets"].is_array() || v["data_offsets"].size() != 2)
      throw Error(where, "missing 'data_offsets' [begin, end]");
    SafetensorsInfo info;
    info.name = name;
    info.dtype = v["dtype"].get<std::string>();
    const DTypeRow* row = find_dtype(info.dtype);
    if (!row) throw Error(where, "unknown dtype '" + info.dtype + "'");
    uint64_t numel = 1;
    for (const json& d : v["shape"]) {
      if (!d.is_number_unsigned()) throw Error(where, "shape holds a value that is not a non-negative integer");
      uint64_t dim = d.get<uint64_t>();
      if (dim > uint64_t(std::numeric_limits<int64_t>::max()) || mul_overflows(numel, dim, &numel))
        throw Error(where, "shape overflows");
      info.shape.dims.push_back(int64_t(dim));
    }
    for (const json& o : v["data_offsets"])
      if (!o.is_number_unsigned()) throw Error(where, "data_offsets must be non-negative integers");
    info.begin = v["data_offsets"][0].get<uint64_t>();
    info.end = v["data_offsets"][1].get<uint64_t>();
    if (info.begin > info.end)
      throw Error(where, "data_offsets [" + std::to_string(info.begin) + ", " + std::to_string(info.end) + ") reversed");
    if (info.end > f.data_bytes_)
      throw Error(where, "data_offsets [" + std::to_string(info.begin) + ", " + std::to_string(info.end) +
                             ") out of bounds of the " + std::to_string(f.data_bytes_) + "-byte data buffer");
    uint64_t expected = 0;
    if (mul_overflows(numel, uint64_t(row->bytes), &expected) || expected != info.end - info.begin)
      throw Error(where, "holds " + std::to_string(info.end - info.begin) + " bytes but shape " + info.shape.str() +
                             " of " + info.dtype + " needs " + std::to_string(numel * row->bytes));
    infos.push_back(std::move(info));
  }
  std::sort(infos.begin(), infos.end(), [](const SafetensorsInfo& a, const SafetensorsInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  // The tensors tile the data buffer, one after another with no gap and nothing after the last, as
  // the safetensors format (and HF's reader, which refuses "file not fully covered") requires.
  // Empty tensors occupy nothing and may share an offset with anything.
  uint64_t covered = 0;
  const SafetensorsInfo* last = nullptr;
  for (const SafetensorsInfo& cur : infos) {
    if (cur.end == cur.begin) continue;
    if (cur.begin < covered) throw Error(path + ": tensor " + cur.name, "data overlaps tensor " + last->name);
    if (cur.begin > covered)
      throw Error(path + ": tensor " + cur.name,
                  "data starts at byte " + std::to_string(cur.begin) + " of the data buffer, leaving " +
                      std::to_string(cur.begin - covered) + " bytes no tensor covers " +
                      (last ? "after tensor " + last->name : std::string("at its start")));
    covered = cur.end;
    last = &cur;
  }
  if (covered != f.data_bytes_)
    throw Error(path, "the data buffer holds " + std::to_string(f.data_bytes_ - covered) + " bytes after the last tensor's " +
                          "data (" + std::to_string(f.data_bytes_) + " bytes, the tensors cover " +
                          std::to_string(covered) + "): a damaged or appended-to file");
  for (SafetensorsInfo& info : infos) {
    f.names_.push_back(info.name);
    f.infos_.emplace(info.name, std::move(info));
  }
  return f;
}

const SafetensorsInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = infos_.find(name);
  if (it == infos_.end()) throw Error(path_ + ": tensor " + name, "not found in the file");
  return it->second;
}

Tensor SafetensorsFile::view(const std::string& name) const {
  const SafetensorsInfo& i = info(name);
  DType dtype;
  if (!safetensors_dtype_to_ktune(i.dtype, &dtype))
    throw Error(path_ + ": tensor " + name, "dtype " + i.dtype + " is not supported (F32, BF16, F16, I32, I64, U8 are)");
  const uint8_t* p = data_ + i.begin;
  size_t align = dtype_bytes(dtype, 1);
  if (reinterpret_cast<uintptr_t>(p) % align != 0) {
    Tensor copy = Tensor::empty(i.shape, dtype);
    std::memcpy(copy.raw(), p, i.end - i.begin);
    return copy;
  }
  return Tensor::view(const_cast<uint8_t*>(p), i.shape, dtype, mapping_);
}

void SafetensorsFile::release_pages(const std::string& name) const {
  const SafetensorsInfo& i = info(name);
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data_ + i.begin) + page - 1) / page * page;  // whole pages only:
  const uintptr_t end = reinterpret_cast<uintptr_t>(data_ + i.end) / page * page;                    // neighbours keep theirs
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);  // advice: failure is harmless
}

Tensor SafetensorsFile::to_f32(const std::string& name) const {
  const SafetensorsInfo& i = info(name);
  if (i.dtype != "F32" && i.dtype != "BF16" && i.dtype != "F16")
    throw Error(path_ + ": tensor " + name, "dtype " + i.dtype + " cannot be converted to f32 (F32, BF16, F16 can)");
  Tensor src = view(name);
  if (src.dtype() == DType::F32) return src.clone();
  return src.to(DType::F32);
}

SafetensorsCheckpoint SafetensorsCheckpoint::open(const std::string& path) {
  SafetensorsCheckpoint c;
  c.path_ = path;
  fs::path p(path);
  std::error_code ec;
  fs::path index;
  std::vector<fs::path> files;
  if (fs::is_directory(p, ec)) {
    if (fs::exists(p / "model.safetensors.index.json")) index = p / "model.safetensors.index.json";
    else if (fs::exists(p / "model.safetensors")) files.push_back(p / "model.safetensors");
    else throw Error(path, "no model.safetensors.index.json or model.safetensors in the directory");
  } else if (p.extension() == ".json") {
    index = p;
  } else {
    files.push_back(p);
  }
  std::map<std::string, std::string> weight_map;  // tensor -> file name, from the index
  if (!index.empty()) {
    std::ifstream in(index);
    if (!in) throw Error(index.string(), "cannot open");
    json j;
    try {
      j = json::parse(in);
    } catch (const json::exception& e) {
      throw Error(index.string(), std::string("not valid JSON: ") + e.what());
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      throw Error(index.string(), "missing object 'weight_map'");
    std::set<std::string> shard_names;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string()) throw Error(index.string() + ": tensor " + it.key(), "weight_map value is not a string");
      std::string shard = it.value().get<std::string>();
      if (shard.empty() || shard.find('/') != std::string::npos || shard == "..")
        throw Error(index.string() + ": tensor " + it.key(), "shard name '" + shard + "' is not a plain file name");
      weight_map[it.key()] = shard;
      shard_names.insert(shard);
    }
    for (const std::string& s : shard_names) files.push_back(index.parent_path() / s);
  }
  for (const fs::path& file : files) {
    c.files_.push_back(SafetensorsFile::open(file.string()));
    const SafetensorsFile& f = c.files_.back();
    for (const std::string& name : f.names()) {
      auto [it, inserted] = c.where_.emplace(name, c.files_.size() - 1);
      if (!inserted)
        throw Error(f.path() + ": tensor " + name, "also stored in " + c.files_[it->second].path());
    }
  }
  for (const auto& [name, shard] : weight_map) {
    auto it = c.where_.find(name);
    if (it == c.where_.end() || fs::path(c.files_[it->second].path()).filename() != shard)
      throw Error(index.string() + ": tensor " + name, "the index names " + shard + " but that shard does not hold it");
  }
  for (const auto& [name, _] : c.where_) c.names_.push_back(name);
  return c;
}

const SafetensorsFile& SafetensorsCheckpoint::file_of(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) throw Error(path_ + ": tensor " + name, "not found in the checkpoint");
  return files_[it->second];
}

// ---------------------------------------------------------------------------------------------
// Writing

namespace {

void pwrite_all(int fd, const void* data, size_t n, uint64_t offset, const std::string& where) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::pwrite(fd, p, std::min<size_t>(n, size_t(1) << 30), off_t(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      throw Error(where, "write failed: " + errno_text());
    }
    p += w;
    n -= size_t(w);
    offset += uint64_t(w);
  }
}

// Allocates the blocks of a file of `bytes` now (fallocate), so that a full disk fails a writer at
// its opening, naming the file and what it needs, rather than partway through a model's worth of
// writes into a sparse file. A filesystem that cannot reserve (EOPNOTSUPP) reports at the write.
void reserve_blocks(int fd, uint64_t bytes, const std::string& path) {
  if (bytes == 0) return;
  int rc;
  while ((rc = fallocate(fd, 0, 0, off_t(bytes))) != 0 && errno == EINTR) {
  }
  if (rc == 0 || errno == EOPNOTSUPP || errno == ENOSYS) return;
  const int error = errno;
  std::string why = std::strerror(error);
  if (error == ENOSPC)
    if (const std::optional<uint64_t> free = free_bytes_at(path)) why += " (" + std::to_string(*free) + " bytes free)";
  throw Error(path, "cannot reserve the file's " + std::to_string(bytes) + " bytes: " + why);
}

}  // namespace

SafetensorsWriter::SafetensorsWriter(std::string path, const std::vector<TensorSpec>& tensors,
                                     const std::map<std::string, std::string>& metadata)
    : path_(std::move(path)) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;  // in the data buffer
  for (const TensorSpec& t : tensors) {
    const std::string where = path_ + ": tensor " + t.name;
    if (t.name.empty() || t.name == "__metadata__") throw Error(where, "invalid tensor name");
    if (slots_.count(t.name)) throw Error(where, "name given twice");
    const uint64_t bytes = dtype_bytes(t.dtype, size_t(t.shape.numel()));
    json entry;
    entry["dtype"] = ktune_dtype_to_safetensors(t.dtype);
    entry["shape"] = t.shape.dims;
    entry["data_offsets"] = {offset, offset + bytes};
    header[t.name] = entry;
    slots_[t.name] = Slot{t, offset, false};
    order_.push_back(t.name);
    offset += bytes;
  }
  std::string text = header.dump();
  while (text.size() % 8 != 0) text.push_back(' ');
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t((uint64_t(text.size()) >> (8 * i)) & 0xff);
  const uint64_t data_start = 8 + uint64_t(text.size());
  for (auto& [name, slot] : slots_) slot.offset += data_start;
  file_ = std::make_unique<AtomicFile>(path_);
  file_->write(len, 8);
  file_->write(text.data(), text.size());
  if (ftruncate(file_->fd(), off_t(data_start + offset)) != 0)  // the whole file's length, however filled
    throw Error(path_, "cannot size the file: " + errno_text());
  reserve_blocks(file_->fd(), data_start + offset, path_);
}

SafetensorsWriter::~SafetensorsWriter() = default;

const TensorSpec& SafetensorsWriter::spec(const std::string& name) const {
  auto it = slots_.find(name);
  if (it == slots_.end()) throw Error(path_ + ": tensor " + name, "not planned in this file");
  return it->second.spec;
}

void SafetensorsWriter::write(const std::string& name, const Tensor& tensor) {
  const std::string where = path_ + ": tensor " + name;
  auto it = slots_.find(name);
  if (it == slots_.end()) throw Error(where, "not planned in this file");
  Slot& slot = it->second;
  check(file_ != nullptr, where, "the file was committed already");
  if (slot.written) throw Error(where, "written twice");
  if (!tensor.defined()) throw Error(where, "undefined tensor");
  if (tensor.device() != Device::CPU) throw Error(where, "only CPU tensors can be written");
  if (tensor.dtype() != slot.spec.dtype || tensor.shape() != slot.spec.shape)
    throw Error(where, "given " + tensor.str() + ", planned " + std::string(dtype_name(slot.spec.dtype)) +
                           slot.spec.shape.str());
  pwrite_all(file_->fd(), tensor.raw(), tensor.bytes(), slot.offset, where);
  slot.written = true;
}

void SafetensorsWriter::commit() {
  check(file_ != nullptr, path_, "committed twice");
  for (const std::string& name : order_)
    if (!slots_.at(name).written) throw Error(path_ + ": tensor " + name, "planned but never written");
  file_->commit();
  file_.reset();
}

void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<PlannedTensor> planned;
  planned.reserve(tensors.size());
  for (const NamedTensor& t : tensors) {
    if (!t.tensor.defined()) throw Error(path + ": tensor " + t.name, "undefined tensor");
    planned.push_back(planned_as_it_is(t.name, t.tensor));
  }
  write_safetensors_streamed(path, planned, metadata);
}

PlannedTensor planned_as_it_is(const std::string& name, const Tensor& tensor) {
  check(tensor.defined(), "tensor " + name, "undefined tensor");
  return {name, tensor.dtype(), tensor.shape(), [tensor] { return tensor; }};  // shares the storage
}

std::vector<PlannedTensor> planned_as_they_are(const std::map<std::string, Tensor>& tensors) {
  std::vector<PlannedTensor> planned;
  planned.reserve(tensors.size());
  for (const auto& [name, tensor] : tensors) planned.push_back(planned_as_it_is(name, tensor));
  return planned;
}

void write_safetensors_streamed(const std::string& path, const std::vector<PlannedTensor>& tensors,
                                const std::map<std::string, std::string>& metadata) {
  std::vector<TensorSpec> specs;
  specs.reserve(tensors.size());
  for (const PlannedTensor& t : tensors) specs.push_back({t.name, t.dtype, t.shape});
  SafetensorsWriter writer(path, specs, metadata);
  for (const PlannedTensor& t : tensors) writer.write(t.name, t.produce());  // each dropped before the next is made
  writer.commit();
}

std::vector<std::string> write_safetensors_sharded(const std::string& dir, const std::vector<NamedTensor>& tensors,
                                                   uint64_t max_shard_bytes,
                                                   const std::map<std::string, std::string>& metadata,
                                                   const std::string& prefix) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(dir, "cannot create directory: " + ec.message());
  std::vector<std::vector<NamedTensor>> shards(1);
  uint64_t current = 0, total = 0;
  for (const NamedTensor& t : tensors) {
    if (!t.tensor.defined()) throw Error(dir + ": tensor " + t.name, "undefined tensor");
    uint64_t b = t.tensor.bytes();
    if (!shards.back().empty() && current + b > max_shard_bytes) {
      shards.emplace_back();
      current = 0;
    }
    shards.back().push_back(t);
    current += b;
    total += b;
  }
  std::vector<std::string> written;
  if (shards.size() == 1) {
    std::string name = prefix + ".safetensors";
    write_safetensors((fs::path(dir) / name).string(), shards[0], metadata);
    written.push_back(name);
    return written;
  }
  json weight_map = json::object();
  const size_t n = shards.size();
  for (size_t s = 0; s < n; ++s) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "-%05zu-of-%05zu.safetensors", s + 1, n);
    std::string name = prefix + buf;
    write_safetensors((fs::path(dir) / name).string(), shards[s], metadata);
    for (const NamedTensor& t : shards[s]) weight_map[t.name] = name;
    written.push_back(name);
  }
  json index;
  index["metadata"] = {{"total_size", total}};
  index["weight_map"] = weight_map;
  std::string index_name = prefix + ".safetensors.index.json";
  write_file_atomic((fs::path(dir) / index_name).string(), index.dump(2) + "\n");
  written.push_back(index_name);
  return written;
}

}  // namespace ktune::io
