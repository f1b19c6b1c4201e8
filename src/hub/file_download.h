// The download discipline every store shares: bytes go to a partial file under the target's
// `.ktune-download/`, a partial left by an earlier attempt (or an earlier run) is resumed with a
// Range request, the finished file is checked against the size and digests the store gave
// (sha256, git blob sha1, MD5), and only then renamed to its real name. 429/5xx and transport
// failures are retried with backoff; other statuses go to the store's own explain_error, which
// turns them into a clear ktune::Error (gated repo, wrong key, no such file…).
// It deliberately does not list remotes or build URLs: a store client hands it one file's
// request factory at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "hub/http_client.h"
#include "hub/target_dir.h"
#include "hub/transfer.h"

namespace ktune::hub {

struct ExpectedContent {
  int64_t size = -1;     // -1: unknown
  std::string sha256;    // lower-case hex, "" when the store gave none
  std::string git_sha1;  // git blob id (Hub regular files)
  std::string md5;       // S3 single-part ETag
  std::string multipart_md5;  // S3 multipart ETag ("<md5 of the parts' MD5s>-<parts>")
  uint64_t part_size = 0;     // ... and the size of its parts (all but the last)
};

struct DownloadJob {
  std::string origin;       // "hf://org/repo", "s3://bucket/prefix": the place named in errors
  std::string name;         // relative path inside the target
  std::string version_tag;  // etag / digest that keys the partial file to one version
  ExpectedContent expected;
  // The request for the bytes from `offset` on (0: the whole file); called once per attempt.
  std::function<HttpRequest(uint64_t offset)> make_request;
  // Throws a clear Error for a response that is neither success nor retryable.
  std::function<void(const HttpResponse&)> explain_error;
  // Optional: what a successful response's headers say about the content changes what is checked
  // (S3: an SSE-KMS object's ETag is not its MD5).
  std::function<void(const HttpResponse&, ExpectedContent&)> adjust_expected;
};

struct FetchResult {
  FetchOutcome outcome = FetchOutcome::Downloaded;
  uint64_t size = 0;              // bytes of the final file
  uint64_t bytes_transferred = 0; // bytes that crossed the network in this call
  std::string path;               // the final local path
};

FetchResult download_file(HttpClient& client, const TargetDir& target, const DownloadJob& job,
                          const RetryPolicy& policy);

// Checks that the target has room for what download_file would still write of `jobs` (a file in
// place at its size: nothing; a partial: the rest; a size the store did not give: nothing), before
// the first byte (TargetDir::check_room).
void check_room_for(const TargetDir& target, const std::vector<DownloadJob>& jobs, const std::string& origin);

// A store's whole download: check_room_for, then every job in turn through download_file, each one
// added to `report` (its file, the bytes transferred) and handed to `progress`, then the partial
// folder removed when nothing is left in it. The first failure throws (what is done stays done).
void download_all(HttpClient& client, const TargetDir& target, const std::vector<DownloadJob>& jobs,
                  const RetryPolicy& policy, const std::string& origin, TransferReport& report,
                  const ProgressFn& progress);

// True when `path` exists and agrees with every part of `expected` that is known (size first,
// digests next). A file with nothing known to compare against is never "up to date".
bool local_file_matches(const std::string& path, const ExpectedContent& expected);
// Throws an Error naming `where` and the first check that failed.
void verify_content(const std::string& path, const ExpectedContent& expected, const std::string& where);

}  // namespace ktune::hub
