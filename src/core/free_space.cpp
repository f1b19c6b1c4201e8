#include "core/free_space.h"

#include <sys/statvfs.h>

#include <filesystem>

namespace ktune {

std::optional<uint64_t> free_bytes_at(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path dir = fs::absolute(path, ec);
  if (ec) return std::nullopt;
  while (!fs::exists(dir, ec) && dir.has_parent_path() && dir.parent_path() != dir) dir = dir.parent_path();
  struct statvfs stats;
  if (statvfs(dir.c_str(), &stats) != 0) return std::nullopt;
  return uint64_t(stats.f_bavail) * stats.f_frsize;
}

}  // namespace ktune
