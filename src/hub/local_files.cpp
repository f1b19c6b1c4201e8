#include "hub/local_files.h"

#include <fcntl.h>
#include <linux/fs.h>  // FICLONE
#include <sys/ioctl.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <utility>
#include <vector>

#include "core/atomic_file.h"
#include "core/error.h"
#include "hub/http_client.h"
#include "hub/target_dir.h"

namespace ktune::hub {

namespace fs = std::filesystem;

// `from`'s bytes into `to` (made): a copy-on-write clone where the filesystem shares blocks
// (FICLONE: btrfs, XFS; instant, no space used until either side changes), a copy otherwise. Never
// a hard link: editing the fetched copy in place must not edit the source.
static void copy_bytes(const std::string& from, const std::string& to, const std::string& origin,
                       const std::string& name) {
  const int in = ::open(from.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) throw Error(from, std::string("cannot read: ") + std::strerror(errno));
  const int out = ::open(to.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out < 0) {
    const int err = errno;
    ::close(in);
    throw Error(origin + ": file '" + name + "'", "cannot create " + to + ": " + std::strerror(err));
  }
  if (::ioctl(out, FICLONE, in) == 0) {
    ::close(in);
    ::close(out);
    return;
  }
  // 64 MiB at a time in the kernel (sendfile; read and write where a filesystem cannot splice), a
  // TransferInterrupt asked between the pieces.
  std::string failure;
  try {
    bool spliced = true;
    std::vector<char> buffer;
    for (;;) {
      TransferInterrupt::check();
      if (spliced) {
        const ssize_t sent = ::sendfile(out, in, nullptr, size_t(64) << 20);
        if (sent > 0) continue;
        if (sent == 0) break;
        if (errno == EINTR) continue;
        if (errno != EINVAL && errno != ENOSYS) {
          failure = std::strerror(errno);
          break;
        }
        spliced = false;  // nothing was sent: the offsets are where they were
        buffer.resize(size_t(8) << 20);
        continue;
      }
      const ssize_t got = ::read(in, buffer.data(), buffer.size());
      if (got == 0) break;
      if (got < 0 && errno == EINTR) continue;
      if (got < 0 || !write_fully(out, buffer.data(), size_t(got))) {
        failure = std::strerror(errno);
        break;
      }
    }
  } catch (...) {
    ::close(in);
    ::close(out);
    ::unlink(to.c_str());
    throw;
  }
  ::close(in);
  if (::close(out) != 0 && failure.empty()) failure = std::strerror(errno);
  if (!failure.empty()) {
    ::unlink(to.c_str());
    throw Error(origin + ": file '" + name + "'", "copy failed: " + failure);
  }
}

// Copies `from` to target/name through a partial file; returns the outcome.
static FetchOutcome place_file(const std::string& from, const TargetDir& target, const std::string& name,
                               const std::string& origin) {
  TransferInterrupt::check();  // between files too (a clone has no pieces)
  std::string final_path = target.resolve(name, origin);
  struct stat src, dst;
  if (::stat(from.c_str(), &src) != 0) throw Error(from, std::string("cannot read: ") + std::strerror(errno));
  if (::stat(final_path.c_str(), &dst) == 0 && dst.st_dev == src.st_dev && dst.st_ino == src.st_ino)
    return FetchOutcome::UpToDate;  // the target is the source itself
  ::mkdir((target.root() + "/.ktune-download").c_str(), 0755);
  std::string partial = target.partial_path(name, std::to_string(src.st_size));
  ::unlink(partial.c_str());
  copy_bytes(from, partial, origin, name);
  target.commit(partial, final_path, origin);
  return FetchOutcome::Downloaded;
}

// Bytes place_file writes for `from`: none where target/name is that file already; all of them
// otherwise (a clone may take none, but nothing tells beforehand).
static uint64_t bytes_to_place(const std::string& from, const TargetDir& target, const std::string& name,
                               const std::string& origin) {
  const std::string final_path = target.resolve(name, origin);  // refuses an unsafe name, before any write
  struct stat src, dst;
  if (::stat(from.c_str(), &src) != 0) return 0;  // place_file says why
  if (::stat(final_path.c_str(), &dst) == 0 && dst.st_dev == src.st_dev && dst.st_ino == src.st_ino) return 0;
  return uint64_t(src.st_size);
}

// TargetDir::check_room for placing `files` (absolute source, relative name) under target.
static void check_room_to_place(const std::vector<std::pair<std::string, std::string>>& files, const TargetDir& target,
                                const std::string& origin) {
  std::vector<uint64_t> to_write;
  for (const auto& [from, name] : files) to_write.push_back(bytes_to_place(from, target, name, origin));
  target.check_room(to_write, origin);
}

TransferReport copy_local_tree(const std::string& source, const PatternFilter& filter, const std::string& output_dir,
                               const ProgressFn& progress) {
  auto t0 = std::chrono::steady_clock::now();
  const std::string origin = "file://" + source;
  std::error_code ec;
  fs::file_status st = fs::status(source, ec);
  if (ec || !fs::exists(st)) throw Error(origin, "no such file or folder");
  std::vector<std::pair<std::string, std::string>> chosen;  // absolute source, relative name
  if (fs::is_regular_file(st)) {
    std::string name = fs::path(source).filename().string();
    if (filter.keeps(name)) chosen.emplace_back(source, name);
  } else {
    for (auto it = fs::recursive_directory_iterator(source, ec); !ec && it != fs::recursive_directory_iterator();
         it.increment(ec)) {
      if (!it->is_regular_file()) continue;  // folders, sockets; symlinked folders are not entered
      std::string rel = fs::relative(it->path(), source).generic_string();
      if (filter.keeps(rel)) chosen.emplace_back(it->path().string(), rel);
    }
    if (ec) throw Error(origin, "cannot list: " + ec.message());
  }
  std::sort(chosen.begin(), chosen.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  TargetDir target(output_dir);
  RemoveCreatedDirsOnThrow cleanup(target);
  for (const auto& c : chosen) target.resolve(c.second, origin);
  if (chosen.empty()) throw Error(origin, "no file there passes the allow/ignore patterns");
  check_room_to_place(chosen, target, origin);
  TransferReport report;
  report.source = origin;
  report.destination = target.root();
  for (size_t i = 0; i < chosen.size(); ++i) {
    FetchOutcome outcome = place_file(chosen[i].first, target, chosen[i].second, origin);
    uint64_t bytes = uint64_t(fs::file_size(chosen[i].first));
    if (outcome != FetchOutcome::UpToDate) report.bytes_transferred += bytes;
    report.files.push_back({chosen[i].second, bytes, outcome});
    if (progress) progress(i + 1, chosen.size(), report.files.back());
  }
  target.remove_partial_dir_if_empty();
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

TransferReport copy_items_to_dir(const std::vector<UploadItem>& items, const std::string& dest_dir,
                                 const ProgressFn& progress) {
  auto t0 = std::chrono::steady_clock::now();
  TargetDir target(dest_dir);
  RemoveCreatedDirsOnThrow cleanup(target);
  const std::string origin = "file://" + target.root();
  std::vector<std::pair<std::string, std::string>> placed;  // absolute source, relative name
  for (const UploadItem& item : items) placed.emplace_back(item.local_path, item.remote_path);
  check_room_to_place(placed, target, origin);
  TransferReport report;
  report.destination = origin;
  for (size_t i = 0; i < items.size(); ++i) {
    place_file(items[i].local_path, target, items[i].remote_path, origin);
    uint64_t bytes = uint64_t(fs::file_size(items[i].local_path));
    report.bytes_transferred += bytes;
    report.files.push_back({items[i].remote_path, bytes, FetchOutcome::Downloaded});
    if (progress) progress(i + 1, items.size(), report.files.back());
  }
  target.remove_partial_dir_if_empty();
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

}  // namespace ktune::hub
