// The local directory a download lands in, and the rules that keep every file inside it: a name
// from a remote listing (Hub sibling, S3 key, exported path) is refused when it is empty,
// absolute, has `.`/`..`/empty components, a backslash or a NUL, or when an existing component
// under the root is a symlink that leads outside the root. Partial downloads live under
// `<root>/.ktune-download/` with a name no reader would take for the real file, and are renamed
// into place only when whole and checked.
// It deliberately does not defend against a concurrent process swapping directories for
// symlinks between the check and the rename (no openat-based walk): the target is ours.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ktune::hub {

// Throws ktune::Error naming `origin` (e.g. "hf://org/repo") unless `name` is a safe relative path.
void check_relative_name(std::string_view name, const std::string& origin);

class TargetDir {
 public:
  explicit TargetDir(const std::string& root);  // creates root (and parents) if missing

  const std::string& root() const { return root_; }
  // The absolute local path for a remote relative name, after check_relative_name and the
  // symlink check of every existing component.
  std::string resolve(std::string_view name, const std::string& origin) const;
  // Where the partial download of `name` lives; `tag` (an etag or digest) keys it to one version.
  std::string partial_path(std::string_view name, std::string_view tag) const;
  // Creates the parent folders of `final_path` (refusing symlinks) and renames `partial` onto it.
  void commit(const std::string& partial, const std::string& final_path, const std::string& origin) const;
  // Removes the partial-download folder when nothing is left in it.
  void remove_partial_dir_if_empty() const;
  // Removes the partial-download folder, then the folders the constructor created (root and the
  // missing parents it made, innermost first), each only while it is empty: what a transfer that
  // failed before its first byte leaves behind. A partial file (resumable) keeps them all.
  void remove_created_dirs_if_empty() const;
  // Throws an Error naming `origin` and the root unless its filesystem has room for `to_write` (the
  // bytes still to write of each file, 0 for one in place), so that a transfer too large for the
  // disk fails before its first byte, not an hour into it. A filesystem that tells no free space is
  // not checked.
  void check_room(const std::vector<uint64_t>& to_write, const std::string& origin) const;

 private:
  std::string root_;                       // canonical (realpath) form
  std::vector<std::string> created_dirs_;  // folders the constructor made, outermost first
};

// Calls target.remove_created_dirs_if_empty() when the scope it guards is left by an exception, so
// that a download refused or failed before its first byte leaves no empty output folder behind.
class RemoveCreatedDirsOnThrow {
 public:
  explicit RemoveCreatedDirsOnThrow(const TargetDir& target);
  ~RemoveCreatedDirsOnThrow();
  RemoveCreatedDirsOnThrow(const RemoveCreatedDirsOnThrow&) = delete;
  RemoveCreatedDirsOnThrow& operator=(const RemoveCreatedDirsOnThrow&) = delete;

 private:
  const TargetDir& target_;
  int exceptions_at_entry_;
};

}  // namespace ktune::hub
