// Content digests the stores hand out, computed over local files so a download can be checked
// against them: sha256 (Hub LFS files, SigV4 payloads), git blob sha1 (Hub regular files' blobId),
// MD5 (S3 single-part ETags, and the MD5 of part MD5s of multipart ones), and HMAC-SHA256 for SigV4 keys. Thin wrappers over OpenSSL's EVP;
// this file deliberately knows nothing about where a digest came from or what it protects.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace ktune::hub {

enum class DigestKind { Sha256, Sha1, Md5 };

// Incremental digest: update() any number of times, then hex() once.
class Digest {
 public:
  explicit Digest(DigestKind kind);
  ~Digest();
  Digest(const Digest&) = delete;
  Digest& operator=(const Digest&) = delete;
  void update(const void* data, size_t size);
  void update(std::string_view s) { update(s.data(), s.size()); }
  std::string hex();     // lower-case hex of the final digest
  std::string binary();  // raw bytes of the final digest

 private:
  void* ctx_;
};

std::string sha256_hex(std::string_view data);
std::string sha256_file_hex(const std::string& path);
// git's object id of a file's content: sha1("blob <size>\0" + content), the Hub's blobId.
std::string git_blob_sha1_file_hex(const std::string& path);
std::string md5_file_hex(const std::string& path);
// The MD5 of the parts' MD5s (binary, concatenated), hex, then "-<parts>": the ETag S3 gives an
// object uploaded in parts of part_size bytes (the last one shorter).
std::string multipart_md5_file_hex(const std::string& path, uint64_t part_size);
// sha256 of bytes [offset, offset + length) of a file (an S3 multipart part's payload hash).
std::string sha256_file_range_hex(const std::string& path, uint64_t offset, uint64_t length);
std::string hmac_sha256(std::string_view key, std::string_view data);  // raw 32 bytes
std::string to_hex(std::string_view bytes);
std::string base64_encode(std::string_view bytes);

}  // namespace ktune::hub
