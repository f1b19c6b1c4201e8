// What a download or an upload reports back, whichever store it went to: the files (path,
// bytes, whether they were fetched, resumed or already there), totals, and the per-file progress
// callback the CLI turns into one line a file. Shared by the Hub, S3 and file:// clients.
// It deliberately holds no credentials: a report may be printed or stored as it is.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ktune::hub {

// How a file came to be at the destination.
enum class FetchOutcome { Downloaded, Resumed, UpToDate };
inline const char* fetch_outcome_name(FetchOutcome outcome) {
  switch (outcome) {
    case FetchOutcome::Downloaded: return "downloaded";
    case FetchOutcome::Resumed: return "resumed";
    case FetchOutcome::UpToDate: return "up to date";
  }
  return "?";
}

struct TransferredFile {
  std::string path;  // relative to the source root / destination root
  uint64_t bytes = 0;
  FetchOutcome outcome = FetchOutcome::Downloaded;
};

struct TransferReport {
  std::string source;       // display form of where the bytes came from
  std::string destination;  // and where they went
  std::string revision;     // Hub commit sha; "" for stores without one
  std::vector<TransferredFile> files;
  uint64_t bytes_transferred = 0;  // what crossed the network (resumes and skips save the rest)
  double seconds = 0;

  uint64_t total_bytes() const {
    uint64_t n = 0;
    for (const TransferredFile& f : files) n += f.bytes;
    return n;
  }
};

// Called after each file: (1-based index, count, the file).
using ProgressFn = std::function<void(size_t index, size_t count, const TransferredFile& file)>;

// A local file to upload and the relative path it gets at the destination.
struct UploadItem {
  std::string local_path;
  std::string remote_path;
};

}  // namespace ktune::hub
