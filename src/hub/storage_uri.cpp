#include "hub/storage_uri.h"

#include <cctype>

#include "core/error.h"

namespace ktune::hub {

static std::string trim_slashes(std::string s) {
  while (!s.empty() && s.back() == '/') s.pop_back();
  while (!s.empty() && s.front() == '/') s.erase(s.begin());
  return s;
}

static bool valid_repo_part(const std::string& s) {
  if (s.empty() || s.size() > 96 || s == "." || s == "..") return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.')) return false;
  return true;
}

StorageUri parse_storage_uri(const std::string& text) {
  StorageUri uri;
  uri.text = text;
  const std::string where = "storage URI '" + text + "'";
  if (text.rfind("s3://", 0) == 0) {
    uri.scheme = StorageScheme::S3;
    std::string rest = text.substr(5);
    size_t slash = rest.find('/');
    uri.bucket = rest.substr(0, slash);
    uri.subpath = slash == std::string::npos ? "" : rest.substr(slash + 1);
    if (uri.bucket.empty()) throw Error(where, "no bucket after s3://");
    return uri;
  }
  if (text.rfind("file://", 0) == 0) {
    uri.scheme = StorageScheme::File;
    uri.path = text.substr(7);
    // RFC 8089: file://localhost/p names /p on this machine, as file:///p does.
    if (uri.path.rfind("localhost/", 0) == 0) uri.path = uri.path.substr(9);
    if (uri.path.empty()) throw Error(where, "no path after file://");
    return uri;
  }
  std::string rest;
  if (text.rfind("hf://", 0) == 0) {
    rest = text.substr(5);
    if (!rest.empty() && rest.front() == '/')  // hf:///tmp/model: a local path under the Hub's scheme
      throw Error(where, "no repo id after hf:// (a local folder is file://" + rest + ")");
  } else if (text.find("://") == std::string::npos && !text.empty() && text.front() != '/' && text.front() != '.') {
    rest = text;  // torchtune's `tune download org/repo`
  } else {
    throw Error(where, "unsupported scheme: expected hf://org/repo[/path], s3://bucket[/prefix] or file://path");
  }
  rest = trim_slashes(rest);
  size_t first = rest.find('/');
  std::string org = rest.substr(0, first);
  std::string after = first == std::string::npos ? "" : rest.substr(first + 1);
  size_t second = after.find('/');
  std::string name = after.substr(0, second);
  if (!valid_repo_part(org) || (!after.empty() && !valid_repo_part(name)))
    throw Error(where, "a Hugging Face repo id is 'org/name' (letters, digits, '-', '_', '.')");
  uri.repo_id = after.empty() ? org : org + "/" + name;
  uri.subpath = second == std::string::npos ? "" : trim_slashes(after.substr(second + 1));
  return uri;
}

std::string StorageUri::display() const {
  switch (scheme) {
    case StorageScheme::HuggingFace: return "hf://" + repo_id + (subpath.empty() ? "" : "/" + subpath);
    case StorageScheme::S3: return "s3://" + bucket + (subpath.empty() ? "" : "/" + subpath);
    case StorageScheme::File: return "file://" + path;
  }
  return text;
}

}  // namespace ktune::hub
