#include "core/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace ktune {

namespace {

std::string errno_text() { return std::strerror(errno); }

}  // namespace

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  const std::filesystem::path target(path_);
  dir_ = target.parent_path().empty() ? std::filesystem::path(".") : target.parent_path();
  std::string hidden = ".";
  hidden += target.filename().string();
  hidden += ".tmp.XXXXXX";
  const std::string pattern = (dir_ / hidden).string();
  std::vector<char> name(pattern.begin(), pattern.end());
  name.push_back('\0');
  fd_ = mkstemp(name.data());
  if (fd_ < 0) throw Error(path_, "cannot create a temporary file beside it: " + errno_text());
  tmp_ = name.data();
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

bool write_fully(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t written = ::write(fd, p, std::min<size_t>(n, size_t(1) << 30));
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) return false;
    p += written;
    n -= size_t(written);
  }
  return true;
}

void AtomicFile::write(const void* data, size_t n) {
  if (!write_fully(fd_, data, n)) throw Error(path_, "write failed: " + errno_text());
}

void AtomicFile::commit() {
  if (fsync(fd_) != 0) throw Error(path_, "fsync failed: " + errno_text());
  if (fchmod(fd_, 0644) != 0) throw Error(path_, "chmod failed: " + errno_text());
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) throw Error(path_, "close failed: " + errno_text());
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) throw Error(path_, "rename failed: " + errno_text());
  committed_ = true;
  const int dir_fd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    fsync(dir_fd);
    ::close(dir_fd);
  }
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  AtomicFile file(path);
  file.write(bytes.data(), bytes.size());
  file.commit();
}

}  // namespace ktune
