#include "hub/storage.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/log.h"
#include "hub/local_files.h"

namespace ktune::hub {

bool apply_storage_flag(StorageOptions& o, const std::string& flag, const std::string& value) {
  if (flag == "--hf-token" || flag == "--access-token") {
    o.hf_token = value;
    register_secret(value);
  } else if (flag == "--hf-endpoint") {
    o.hf_endpoint = value;
  } else if (flag == "--repo-type") {
    o.hf_repo_type = parse_hf_repo_type(value);
  } else if (flag == "--revision") {
    o.hf_revision = value;
  } else if (flag == "--s3-endpoint") {
    o.s3.endpoint = value;
  } else if (flag == "--s3-region") {
    o.s3.region = value;
  } else if (flag == "--aws-access-key-id") {
    o.s3.credentials.access_key_id = value;
  } else if (flag == "--aws-secret-access-key") {
    o.s3.credentials.secret_access_key = value;
    register_secret(value);
  } else if (flag == "--aws-session-token") {
    o.s3.credentials.session_token = value;
    register_secret(value);
  } else if (flag == "--role-arn") {
    o.s3.role_arn = value;
  } else if (flag == "--aws-profile") {  // the AWS CLI's --profile: asked for by name
    o.s3.profile.name = value;
    o.s3.profile.asked_for = true;
  } else if (flag == "--allow-patterns") {
    for (std::string& p : split_pattern_list(value)) o.filter.allow.push_back(std::move(p));
  } else if (flag == "--ignore-patterns") {
    for (std::string& p : split_pattern_list(value)) o.filter.ignore.push_back(std::move(p));
  } else if (flag == "--max-attempts") {
    o.retry.max_attempts = std::max(1, std::atoi(value.c_str()));
  } else {
    return false;
  }
  return true;
}

void write_original_repo_id(const std::string& output_dir, const std::string& repo_id) {
  const std::filesystem::path path = std::filesystem::path(output_dir) / "original_repo_id.json";
  write_file_atomic(path.string(), nlohmann::json{{"repo_id", repo_id}}.dump(4) + "\n");
}

TransferReport download_uri(const StorageUri& uri, const std::string& output_dir, const StorageOptions& options,
                            const ProgressFn& progress) {
  switch (uri.scheme) {
    case StorageScheme::HuggingFace: {
      HfHubClient hub({options.hf_endpoint, options.hf_token, options.retry});
      TransferReport report = hub.download(uri.repo_id, options.hf_repo_type, options.hf_revision, uri.subpath,
                                           options.filter, output_dir, progress);
      if (options.hf_repo_type == HfRepoType::Model && uri.subpath.empty()) write_original_repo_id(output_dir, uri.repo_id);
      return report;
    }
    case StorageScheme::S3: {
      S3Options s3 = options.s3;
      s3.retry = options.retry;
      S3Client client(s3);
      return client.download(uri.bucket, uri.subpath, options.filter, output_dir, progress);
    }
    case StorageScheme::File:
      return copy_local_tree(uri.path, options.filter, output_dir, progress);
  }
  throw Error(uri.text, "unsupported storage URI");
}

TransferReport upload_to_uri(const StorageUri& uri, const std::vector<UploadItem>& files,
                             const StorageOptions& options, const ProgressFn& progress) {
  switch (uri.scheme) {
    case StorageScheme::HuggingFace: {
      auto t0 = std::chrono::steady_clock::now();
      HfHubClient hub({options.hf_endpoint, options.hf_token, options.retry});
      std::vector<UploadItem> placed = files;
      if (!uri.subpath.empty())
        for (UploadItem& f : placed) f.remote_path = uri.subpath + "/" + f.remote_path;
      TransferReport report;
      report.destination = uri.display();
      report.revision =
          hub.upload(uri.repo_id, options.hf_repo_type, options.hf_revision, placed, options.commit_message, nullptr);
      for (size_t i = 0; i < files.size(); ++i) {
        struct stat st;
        uint64_t bytes = ::stat(files[i].local_path.c_str(), &st) == 0 ? uint64_t(st.st_size) : 0;
        report.files.push_back({files[i].remote_path, bytes, FetchOutcome::Downloaded});
        report.bytes_transferred += bytes;
        if (progress) progress(i + 1, files.size(), report.files.back());
      }
      report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      return report;
    }
    case StorageScheme::S3: {
      S3Options s3 = options.s3;
      s3.retry = options.retry;
      S3Client client(s3);
      return client.upload(uri.bucket, uri.subpath, files, progress);
    }
    case StorageScheme::File:
      return copy_items_to_dir(files, uri.path, progress);
  }
  throw Error(uri.text, "unsupported storage URI");
}

}  // namespace ktune::hub
