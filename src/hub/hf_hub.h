// A Hugging Face Hub client over its HTTP API (the subset huggingface_hub's snapshot_download and
// upload_folder use): GET /api/{models|datasets}/{repo}/revision/{rev}?blobs=true for the commit
// sha and the file list with sizes, git blob ids and LFS sha256; GET /{datasets/}{repo}/resolve/
// {sha}/{path} (redirects to a CDN for LFS files) for the bytes, pinned to that one commit.
// Errors say which of the Hub's cases it is: a gated repo (no token / token not granted), a
// token the Hub rejects, no such repo/revision/file. The token goes in an Authorization header
// only, is registered with ktune::register_secret, and never reaches a log line or a file.
// Uploads use the commit API: preupload (regular vs LFS), the LFS batch API with the "basic"
// transfer (one PUT per object) and verify, then an NDJSON commit.
// It deliberately does not implement: the Xet storage protocol, LFS "multipart" transfers (so
// one LFS object is limited to what a single PUT to the storage accepts, 5 GB on the real Hub),
// pull requests, the local HF cache layout (~/.cache/huggingface), or Spaces.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hub/http_client.h"
#include "hub/patterns.h"
#include "hub/transfer.h"

namespace ktune::hub {

enum class HfRepoType { Model, Dataset };
HfRepoType parse_hf_repo_type(const std::string& text);  // "model" | "dataset"

struct HfSibling {
  std::string path;     // rfilename, as the Hub lists it (not yet checked for safety)
  int64_t size = -1;    // bytes of the real file (LFS size for LFS files)
  std::string blob_id;  // git blob id; for LFS files the pointer's, not the content's
  std::string lfs_sha256;  // content sha256 for LFS files, "" otherwise
};

struct HfRepoInfo {
  std::string repo_id;
  HfRepoType type = HfRepoType::Model;
  std::string sha;  // the commit the revision resolved to
  std::vector<HfSibling> siblings;
};

struct HfOptions {
  std::string endpoint;  // "" → $HF_ENDPOINT, else https://huggingface.co
  std::string token;     // "" → anonymous
  RetryPolicy retry;
};

// $HF_ENDPOINT without a trailing slash, or https://huggingface.co.
std::string hf_endpoint_from_env();

class HfHubClient {
 public:
  explicit HfHubClient(HfOptions options);

  HfRepoInfo repo_info(const std::string& repo_id, HfRepoType type, const std::string& revision = "main");

  // Downloads the files of `repo_id` at `revision` that lie under `subpath` (a folder or one file;
  // "" = all) and pass `filter`, into output_dir at their repo-relative paths.
  TransferReport download(const std::string& repo_id, HfRepoType type, const std::string& revision,
                          const std::string& subpath, const PatternFilter& filter, const std::string& output_dir,
                          const ProgressFn& progress = nullptr);

  // Creates the repo when it does not exist (private), then commits `files` in one commit on
  // `revision`. Returns the commit id the Hub reports.
  std::string upload(const std::string& repo_id, HfRepoType type, const std::string& revision,
                     const std::vector<UploadItem>& files, const std::string& commit_message,
                     const ProgressFn& progress = nullptr);

  const std::string& endpoint() const { return options_.endpoint; }

 private:
  Headers auth_headers() const;
  std::string api_base(const std::string& repo_id, HfRepoType type) const;  // .../api/models/org/name
  std::string repo_url(const std::string& repo_id, HfRepoType type) const;  // .../{datasets/}org/name
  [[noreturn]] void raise(const HttpResponse& r, const std::string& where, const std::string& repo_id,
                          HfRepoType type) const;
  void ensure_repo(const std::string& repo_id, HfRepoType type);

  HfOptions options_;
  HttpClient http_;
};

}  // namespace ktune::hub
