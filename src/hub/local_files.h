// file:// as a store: a local folder (or one file) copied into a target with the same discipline
// as a download (checked names, a partial file renamed into place), always a copy of its own (a
// copy-on-write clone where the filesystem has them, never a hard link, so that editing the fetched
// files leaves the source as it was); and the same in the other direction for the exporter.
// It deliberately does not follow symlinked folders in the source (no cycles, no surprises) and
// does not preserve permissions or times.
#pragma once

#include <string>
#include <vector>

#include "hub/patterns.h"
#include "hub/transfer.h"

namespace ktune::hub {

// Files under `source` (a folder: relative paths; a file: its basename) that pass `filter`.
TransferReport copy_local_tree(const std::string& source, const PatternFilter& filter, const std::string& output_dir,
                               const ProgressFn& progress = nullptr);

// Copies each item to dest_dir/remote_path (always a copy: exports must outlive their source).
TransferReport copy_items_to_dir(const std::vector<UploadItem>& items, const std::string& dest_dir,
                                 const ProgressFn& progress = nullptr);

}  // namespace ktune::hub
