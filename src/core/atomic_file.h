// A file that appears whole or not at all: written into a temporary beside it, then fsynced, renamed
// over the path and the directory fsynced (a reader, or a run killed mid-write, never sees half a
// file). The checkpointer's files, safetensors shards, configs and the hub's small records use it.
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>

namespace ktune {

class AtomicFile {
 public:
  // Creates the temporary (.NAME.tmp.XXXXXX beside path); throws ktune::Error naming path if it cannot.
  explicit AtomicFile(std::string path);
  // Removes the temporary unless committed.
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  int fd() const { return fd_; }  // the temporary's, for pwrite and ftruncate
  // Appends n bytes at the file offset (retrying short writes and EINTR).
  void write(const void* data, size_t n);
  // fsync, mode 0644, close, rename over path, fsync of the directory.
  void commit();

 private:
  std::string path_, tmp_;
  std::filesystem::path dir_;
  int fd_ = -1;
  bool committed_ = false;
};

// Writes all n bytes to fd (short writes and EINTR retried, at most 1 GiB a call); false with errno
// set on a failure.
bool write_fully(int fd, const void* data, size_t n);

// Writes bytes to path through an AtomicFile.
void write_file_atomic(const std::string& path, const std::string& bytes);

}  // namespace ktune
