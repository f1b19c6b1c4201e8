#include "hub/digest.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <vector>

#include "core/error.h"

namespace ktune::hub {

static const EVP_MD* md_for(DigestKind kind) {
  switch (kind) {
    case DigestKind::Sha256: return EVP_sha256();
    case DigestKind::Sha1: return EVP_sha1();
    case DigestKind::Md5: return EVP_md5();
  }
  return EVP_sha256();
}

Digest::Digest(DigestKind kind) : ctx_(EVP_MD_CTX_new()) {
  if (ctx_ == nullptr || EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(ctx_), md_for(kind), nullptr) != 1)
    throw Error("digest", "OpenSSL could not initialise a digest");
}

Digest::~Digest() { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_)); }

void Digest::update(const void* data, size_t size) {
  EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), data, size);
}

std::string Digest::binary() {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), out, &n);
  return std::string(reinterpret_cast<char*>(out), n);
}

std::string Digest::hex() { return to_hex(binary()); }

std::string to_hex(std::string_view bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

std::string sha256_hex(std::string_view data) {
  Digest d(DigestKind::Sha256);
  d.update(data);
  return d.hex();
}

// Streams a file through `d` (after an optional prefix), 1 MiB at a time.
static void digest_file(Digest& d, const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) throw Error(path, "cannot open for hashing");
  std::vector<char> buf(1 << 20);
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f.get())) > 0) d.update(buf.data(), n);
  if (std::ferror(f.get())) throw Error(path, "read error while hashing");
}

std::string sha256_file_hex(const std::string& path) {
  Digest d(DigestKind::Sha256);
  digest_file(d, path);
  return d.hex();
}

std::string sha256_file_range_hex(const std::string& path, uint64_t offset, uint64_t length) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f || std::fseek(f.get(), long(offset), SEEK_SET) != 0) throw Error(path, "cannot open for hashing");
  Digest d(DigestKind::Sha256);
  std::vector<char> buf(1 << 20);
  while (length > 0) {
    size_t n = std::fread(buf.data(), 1, size_t(std::min<uint64_t>(buf.size(), length)), f.get());
    if (n == 0) throw Error(path, "file ended before the range to hash did");
    d.update(buf.data(), n);
    length -= n;
  }
  return d.hex();
}

std::string md5_file_hex(const std::string& path) {
  Digest d(DigestKind::Md5);
  digest_file(d, path);
  return d.hex();
}

std::string multipart_md5_file_hex(const std::string& path, uint64_t part_size) {
  if (part_size == 0) throw Error(path, "a multipart digest needs a part size");
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) throw Error(path, "cannot open for hashing");
  Digest of_parts(DigestKind::Md5);
  std::vector<char> buf(1 << 20);
  uint64_t parts = 0;
  while (true) {
    Digest part(DigestKind::Md5);
    uint64_t in_part = 0;
    while (in_part < part_size) {
      const size_t n = std::fread(buf.data(), 1, size_t(std::min<uint64_t>(buf.size(), part_size - in_part)), f.get());
      if (n == 0) break;
      part.update(buf.data(), n);
      in_part += n;
    }
    if (std::ferror(f.get())) throw Error(path, "read error while hashing");
    if (in_part == 0 && parts > 0) break;  // the file ended at a part's end
    of_parts.update(part.binary());
    ++parts;
    if (in_part < part_size) break;  // the last, shorter part
  }
  return of_parts.hex() + "-" + std::to_string(parts);
}

std::string git_blob_sha1_file_hex(const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) throw Error(path, "cannot open for hashing");
  std::fseek(f.get(), 0, SEEK_END);
  long size = std::ftell(f.get());
  f.reset();
  Digest d(DigestKind::Sha1);
  std::string header = "blob " + std::to_string(size);
  d.update(header.data(), header.size() + 1);  // includes the terminating NUL
  digest_file(d, path);
  return d.hex();
}

std::string hmac_sha256(std::string_view key, std::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  HMAC(EVP_sha256(), key.data(), int(key.size()), reinterpret_cast<const unsigned char*>(data.data()), data.size(),
       out, &n);
  return std::string(reinterpret_cast<char*>(out), n);
}

std::string base64_encode(std::string_view bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3) + 1, '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(bytes.data()), int(bytes.size()));
  out.resize(size_t(n));
  return out;
}

}  // namespace ktune::hub
