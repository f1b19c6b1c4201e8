// The storage URIs of the upstream initializer contract and of the exporter, parsed once:
//   hf://org/repo[/subpath]   (also a bare "org/repo[/subpath]", torchtune's `tune download` spelling)
//   s3://bucket[/prefix]
//   file:///abs/path  or  file://relative/path
// It deliberately does not resolve anything (no network, no filesystem access).
#pragma once

#include <string>

namespace ktune::hub {

enum class StorageScheme { HuggingFace, S3, File };

struct StorageUri {
  StorageScheme scheme = StorageScheme::HuggingFace;
  std::string text;     // as given
  std::string repo_id;  // hf: "org/repo" (or "repo" for a user-less legacy id)
  std::string subpath;  // hf: path inside the repo ("" = whole repo); s3: the key prefix
  std::string bucket;   // s3
  std::string path;     // file: the local path

  std::string display() const;  // canonical form for logs and summaries
};

// Throws ktune::Error naming the URI when it is none of the forms above.
StorageUri parse_storage_uri(const std::string& text);

}  // namespace ktune::hub
