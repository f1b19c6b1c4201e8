// The one entry point that picks a store by URI scheme: download a storage URI into a folder,
// or upload files to one. The initializer steps, `ktune download` and the exporter all come
// through here, so every store gets the same options (patterns, tokens, S3 keys, retries).
// It deliberately holds no policy of its own (which files a model needs is the initializer's
// business; which outputs to export is the exporter's).
#pragma once

#include <string>
#include <vector>

#include "hub/hf_hub.h"
#include "hub/patterns.h"
#include "hub/s3_client.h"
#include "hub/storage_uri.h"
#include "hub/transfer.h"

namespace ktune::hub {

struct StorageOptions {
  PatternFilter filter;                     // downloads only
  std::string hf_token;                     // registered as a secret by the Hub client
  std::string hf_endpoint;                  // "" → $HF_ENDPOINT or https://huggingface.co
  HfRepoType hf_repo_type = HfRepoType::Model;
  std::string hf_revision = "main";
  S3Options s3;                             // endpoint, region, keys (see s3_options_from_env)
  RetryPolicy retry;
  std::string commit_message = "Upload with ktune export";  // hf:// uploads
};

// The store flags every hub command shares: --hf-token, --hf-endpoint, --repo-type, --revision,
// --s3-endpoint, --s3-region, --aws-access-key-id, --aws-secret-access-key, --aws-session-token, --role-arn,
// --allow-patterns, --ignore-patterns, --max-attempts. Returns false when `flag` is none of them.
// Secrets given as flags are registered with ktune::register_secret.
bool apply_storage_flag(StorageOptions& options, const std::string& flag, const std::string& value);

// Writes output_dir/original_repo_id.json, {"repo_id": "org/name"}, as torchtune's `tune download`
// does: a model downloaded from the Hub remembers its repo, which a trained adapter names as its
// base (adapter_config.json's base_model_name_or_path). download_uri writes it for hf:// models.
void write_original_repo_id(const std::string& output_dir, const std::string& repo_id);

TransferReport download_uri(const StorageUri& uri, const std::string& output_dir, const StorageOptions& options,
                            const ProgressFn& progress = nullptr);

// Uploads `files` under the URI (hf: repo root or subpath; s3: the prefix; file: the folder).
TransferReport upload_to_uri(const StorageUri& uri, const std::vector<UploadItem>& files,
                             const StorageOptions& options, const ProgressFn& progress = nullptr);

}  // namespace ktune::hub
