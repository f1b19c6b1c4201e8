#include "hub/target_dir.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <optional>

#include "core/error.h"
#include "core/free_space.h"
#include "hub/digest.h"

namespace ktune::hub {

namespace fs = std::filesystem;

static const char* kPartialDir = ".ktune-download";

void check_relative_name(std::string_view name, const std::string& origin) {
  std::string where = origin + ": file '" + std::string(name) + "'";
  if (name.empty()) throw Error(origin, "a remote file has an empty name");
  if (name.find('\0') != std::string_view::npos) throw Error(where, "name contains a NUL byte; refused");
  if (name.find('\\') != std::string_view::npos) throw Error(where, "name contains a backslash; refused");
  if (name.front() == '/') throw Error(where, "absolute name would escape the target directory; refused");
  size_t start = 0;
  while (start <= name.size()) {
    size_t end = name.find('/', start);
    if (end == std::string_view::npos) end = name.size();
    std::string_view part = name.substr(start, end - start);
    if (part == "..") throw Error(where, "'..' component would escape the target directory; refused");
    if (part == "." || part.empty()) throw Error(where, "empty or '.' path component; refused");
    start = end + 1;
  }
  if (name.substr(0, std::strlen(kPartialDir)) == kPartialDir &&
      (name.size() == std::strlen(kPartialDir) || name[std::strlen(kPartialDir)] == '/'))
    throw Error(where, "name collides with ktune's partial-download folder; refused");
}

static bool is_within(const std::string& path, const std::string& root) {
  return path == root || (path.size() > root.size() && path.compare(0, root.size(), root) == 0 &&
                          (root.back() == '/' || path[root.size()] == '/'));
}

// The folders of `root` (itself and its parents) that do not exist yet, outermost first.
static std::vector<std::string> missing_dirs(const std::string& root) {
  std::vector<std::string> missing;
  std::error_code ec;
  for (fs::path p = fs::absolute(root, ec); !ec && !p.empty() && !fs::exists(fs::symlink_status(p));
       p = p.parent_path()) {
    missing.insert(missing.begin(), p.string());
    if (p == p.parent_path()) break;
  }
  return missing;
}

TargetDir::TargetDir(const std::string& root) : created_dirs_(missing_dirs(root)) {
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) throw Error(root, "cannot create the target directory: " + ec.message());
  char buf[PATH_MAX];
  if (::realpath(root.c_str(), buf) == nullptr) throw Error(root, std::string("cannot resolve: ") + std::strerror(errno));
  root_ = buf;
}

// Checks every existing component of root/name below root: a symlink must resolve inside root.
static void check_components(const std::string& root, std::string_view name, const std::string& origin) {
  std::string path = root;
  size_t start = 0;
  while (start < name.size()) {
    size_t end = name.find('/', start);
    if (end == std::string_view::npos) end = name.size();
    path += "/";
    path += name.substr(start, end - start);
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) return;  // does not exist yet: nothing below can either
    if (S_ISLNK(st.st_mode)) {
      bool last = end == name.size();
      if (!last) {
        char buf[PATH_MAX];
        if (::realpath(path.c_str(), buf) == nullptr || !is_within(buf, root))
          throw Error(origin + ": file '" + std::string(name) + "'",
                      "'" + path + "' is a symlink leading outside the target directory; refused");
      }
      // The last component being a symlink is harmless: the rename replaces the link itself.
    }
    start = end + 1;
  }
}

std::string TargetDir::resolve(std::string_view name, const std::string& origin) const {
  check_relative_name(name, origin);
  check_components(root_, name, origin);
  return root_ + "/" + std::string(name);
}

std::string TargetDir::partial_path(std::string_view name, std::string_view tag) const {
  std::string base(name.substr(name.rfind('/') == std::string_view::npos ? 0 : name.rfind('/') + 1));
  std::string clean_tag;
  for (char c : tag)
    if (std::isalnum(static_cast<unsigned char>(c)) && clean_tag.size() < 16) clean_tag.push_back(c);
  if (clean_tag.empty()) clean_tag = "untagged";
  // The name's hash keeps two files with one basename apart without nesting folders.
  return root_ + "/" + kPartialDir + "/" + sha256_hex(name).substr(0, 12) + "-" + base + "." + clean_tag + ".incomplete";
}

void TargetDir::commit(const std::string& partial, const std::string& final_path, const std::string& origin) const {
  std::string name = final_path.substr(root_.size() + 1);
  // Create parents one at a time, re-checking that none is (or became) an escaping symlink.
  size_t at = 0;
  while ((at = name.find('/', at)) != std::string::npos) {
    std::string dir = root_ + "/" + name.substr(0, at);
    if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
      throw Error(dir, std::string("cannot create folder: ") + std::strerror(errno));
    ++at;
  }
  check_components(root_, name, origin);
  struct stat st;
  if (::lstat(final_path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    throw Error(origin + ": file '" + name + "'", "a folder of that name exists in the target; refused");
  if (::rename(partial.c_str(), final_path.c_str()) != 0)
    throw Error(final_path, std::string("cannot move the finished download into place: ") + std::strerror(errno));
}

void TargetDir::remove_partial_dir_if_empty() const {
  std::string dir = root_ + "/" + kPartialDir;
  ::rmdir(dir.c_str());  // fails harmlessly when not empty or absent
}

void TargetDir::remove_created_dirs_if_empty() const {
  remove_partial_dir_if_empty();
  for (auto it = created_dirs_.rbegin(); it != created_dirs_.rend(); ++it)
    if (::rmdir(it->c_str()) != 0) return;  // not empty (or gone): its parents are not empty either
}

RemoveCreatedDirsOnThrow::RemoveCreatedDirsOnThrow(const TargetDir& target)
    : target_(target), exceptions_at_entry_(std::uncaught_exceptions()) {}

RemoveCreatedDirsOnThrow::~RemoveCreatedDirsOnThrow() {
  if (std::uncaught_exceptions() > exceptions_at_entry_) target_.remove_created_dirs_if_empty();
}

void TargetDir::check_room(const std::vector<uint64_t>& to_write, const std::string& origin) const {
  uint64_t bytes = 0;
  size_t files = 0;
  for (uint64_t b : to_write) {
    bytes += b;
    files += b > 0;
  }
  if (bytes == 0) return;
  const std::optional<uint64_t> free = free_bytes_at(root_);
  if (!free || *free >= bytes) return;
  throw Error(origin, std::to_string(bytes) + " bytes (" + std::to_string(files) + " file" + (files == 1 ? "" : "s") +
                          ") to write into " + root_ + ", but its filesystem has " + std::to_string(*free) +
                          " bytes free: free space or choose another destination");
}

}  // namespace ktune::hub
