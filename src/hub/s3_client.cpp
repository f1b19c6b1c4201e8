#include "hub/s3_client.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string_view>

#include "core/log.h"
#include "hub/aws_config.h"
#include "hub/digest.h"
#include "hub/file_download.h"

namespace ktune::hub {

static const std::string kEmptySha256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

S3Options s3_options_from_env(const EnvLookup& env) {
  auto value = [&](const char* name) { return env_value(env, name); };
  auto first_of = [&](const char* a, const char* b) { return !value(a).empty() ? value(a) : value(b); };
  S3Options o;
  o.endpoint = first_of("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL");
  o.region = first_of("AWS_REGION", "AWS_DEFAULT_REGION");
  o.credentials.access_key_id = value("AWS_ACCESS_KEY_ID");
  o.credentials.secret_access_key = value("AWS_SECRET_ACCESS_KEY");
  o.credentials.session_token = value("AWS_SESSION_TOKEN");
  s3_roles_from_env(o, env);
  return o;
}

void s3_roles_from_env(S3Options& o, const EnvLookup& env) {
  const auto value = [&](const char* name) { return env_value(env, name); };
  o.web_identity_role_arn = value("AWS_ROLE_ARN");
  o.web_identity_token_file = value("AWS_WEB_IDENTITY_TOKEN_FILE");
  o.sts_endpoint = value("AWS_ENDPOINT_URL_STS");
  if (o.sts_endpoint.empty()) o.sts_endpoint = value("AWS_ENDPOINT_URL");
  if (std::string v = value("AWS_ROLE_SESSION_NAME"); !v.empty()) o.role_session_name = v;
  o.profile = aws_profile_choice_from_env(env);
}

namespace {

std::string read_token_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path, "cannot read the web identity token (AWS_WEB_IDENTITY_TOKEN_FILE)");
  std::string token((std::istreambuf_iterator<char>(in)), {});
  while (!token.empty() && std::isspace((unsigned char)token.back())) token.pop_back();
  if (token.empty()) throw Error(path, "the web identity token file is empty");
  return token;
}

// Where the client's credentials come from (see S3Options): a role assumed with the key or the
// web identity token, the key itself, or EKS's web identity role.
std::shared_ptr<CredentialSource> credential_source(const S3Options& o) {
  StsOptions sts;
  // MinIO and other stores serve STS at their own endpoint; AWS at sts.<region>.amazonaws.com.
  sts.endpoint = !o.sts_endpoint.empty() ? o.sts_endpoint
                 : o.endpoint.find("amazonaws.com") == std::string::npos ? o.endpoint : std::string();
  sts.region = o.region;
  sts.session_name = o.role_session_name.empty() ? "ktune" : o.role_session_name;
  sts.external_id = o.role_external_id;
  sts.retry = o.retry;
  const bool has_key = !o.credentials.access_key_id.empty() && !o.credentials.secret_access_key.empty();
  if (!o.role_arn.empty() && (has_key || o.web_identity_token_file.empty()))
    return std::make_shared<CredentialSource>(std::function<TemporaryCredentials()>(
        [sts, key = o.credentials, role = o.role_arn] { return sts_assume_role(sts, key, role); }));
  if (o.role_arn.empty() && has_key) return std::make_shared<CredentialSource>(o.credentials);
  // A pod's web identity into role_arn, or else into the pod's own role (AWS_ROLE_ARN): straight in,
  // or (as the AWS SDKs chain it) first into the pod's role, whose credentials then assume role_arn.
  const std::string role = !o.role_arn.empty() ? o.role_arn : o.web_identity_role_arn;
  if (!role.empty() && !o.web_identity_token_file.empty())
    return std::make_shared<CredentialSource>(std::function<TemporaryCredentials()>(
        [sts, file = o.web_identity_token_file, pod_role = o.web_identity_role_arn, role] {
          if (pod_role.empty() || pod_role == role)
            return sts_assume_role_with_web_identity(sts, role, read_token_file(file));
          const TemporaryCredentials pod = sts_assume_role_with_web_identity(sts, pod_role, read_token_file(file));
          return sts_assume_role(sts, pod.credentials, role);
        }));
  throw Error("s3", "no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or pass them as flags), name "
                    "an AWS profile that has them (AWS_PROFILE; " +
                        (o.profile.credentials_file.empty() ? std::string("~/.aws/credentials") : o.profile.credentials_file) +
                        "), or run with a web identity (AWS_ROLE_ARN and AWS_WEB_IDENTITY_TOKEN_FILE)");
}

}  // namespace

S3Client::S3Client(S3Options options) : options_(std::move(options)) {
  apply_aws_profile(options_);
  while (!options_.endpoint.empty() && options_.endpoint.back() == '/') options_.endpoint.pop_back();
  if (options_.region.empty()) options_.region = "us-east-1";
  register_secret(options_.credentials.secret_access_key);
  register_secret(options_.credentials.session_token);
  credentials_ = credential_source(options_);
  if (options_.part_size < (5ull << 20)) options_.part_size = 5ull << 20;
}

std::vector<std::string> xml_elements(const std::string& xml, const std::string& tag) {
  std::vector<std::string> out;
  const std::string open = "<" + tag + ">", close = "</" + tag + ">";
  size_t at = 0;
  while ((at = xml.find(open, at)) != std::string::npos) {
    size_t start = at + open.size();
    size_t end = xml.find(close, start);
    if (end == std::string::npos) break;
    std::string raw = xml.substr(start, end - start), text;
    for (size_t i = 0; i < raw.size(); ++i) {
      if (raw[i] != '&') {
        text.push_back(raw[i]);
        continue;
      }
      size_t semi = raw.find(';', i);
      std::string ent = semi == std::string::npos ? "" : raw.substr(i + 1, semi - i - 1);
      if (ent == "amp") text.push_back('&');
      else if (ent == "lt") text.push_back('<');
      else if (ent == "gt") text.push_back('>');
      else if (ent == "quot") text.push_back('"');
      else if (ent == "apos") text.push_back('\'');
      else if (!ent.empty() && ent[0] == '#') {
        long cp = ent.size() > 1 && (ent[1] == 'x' || ent[1] == 'X') ? std::strtol(ent.c_str() + 2, nullptr, 16)
                                                                     : std::strtol(ent.c_str() + 1, nullptr, 10);
        // UTF-8 encode the code point.
        if (cp < 0x80) text.push_back(char(cp));
        else if (cp < 0x800) { text.push_back(char(0xC0 | (cp >> 6))); text.push_back(char(0x80 | (cp & 0x3F))); }
        else if (cp < 0x10000) { text.push_back(char(0xE0 | (cp >> 12))); text.push_back(char(0x80 | ((cp >> 6) & 0x3F))); text.push_back(char(0x80 | (cp & 0x3F))); }
        else { text.push_back(char(0xF0 | (cp >> 18))); text.push_back(char(0x80 | ((cp >> 12) & 0x3F))); text.push_back(char(0x80 | ((cp >> 6) & 0x3F))); text.push_back(char(0x80 | (cp & 0x3F))); }
      } else {
        text.push_back('&');
        continue;
      }
      i = semi;
    }
    out.push_back(std::move(text));
    at = end + close.size();
  }
  return out;
}

S3Client::Target S3Client::target_for(const std::string& bucket) const {
  Target t;
  std::string base = options_.endpoint;
  bool path_style = true;
  if (base.empty()) {
    path_style = bucket.find('.') != std::string::npos;
    base = "https://" + (path_style ? std::string() : bucket + ".") + "s3." + options_.region + ".amazonaws.com";
  }
  const std::string host = sigv4_host_of(base, "S3 endpoint");
  const std::string scheme = base.substr(0, base.find("://"));
  t.host = host;
  t.path_prefix = path_style ? "/" + url_encode(bucket, false) : "";
  t.url_base = scheme + "://" + host + t.path_prefix;
  return t;
}

HttpRequest S3Client::signed_request(const std::string& method, const std::string& bucket, const std::string& key,
                                     const std::vector<std::pair<std::string, std::string>>& query,
                                     const std::string& payload_sha256) const {
  Target t = target_for(bucket);
  SigV4Input in;
  in.method = method;
  in.host = t.host;
  // A bucket-level request (listing) addresses "/bucket" path-style, "/" virtual-hosted.
  std::string path = key.empty() ? (t.path_prefix.empty() ? "/" : t.path_prefix) : t.path_prefix + "/" + url_encode(key, true);
  in.canonical_uri = path;
  in.query = query;
  in.payload_sha256 = payload_sha256;
  in.region = options_.region;
  in.service = "s3";
  in.amz_date = amz_date_now();
  HttpRequest r;
  r.method = method;
  std::string q = sigv4_canonical_query(query);
  r.url = t.url_base.substr(0, t.url_base.size() - t.path_prefix.size()) + path + (q.empty() ? "" : "?" + q);
  r.headers = sigv4_sign(in, credentials_->current());
  return r;
}

void S3Client::raise(const HttpResponse& r, const std::string& where) const {
  std::vector<std::string> codes = xml_elements(r.body, "Code");
  std::vector<std::string> messages = xml_elements(r.body, "Message");
  std::string code = codes.empty() ? "" : codes[0];
  std::string message = messages.empty() ? "" : messages[0];
  std::string hint;
  if (code == "SignatureDoesNotMatch")
    hint = "the secret key does not match the access key id (or the region or clock is wrong)";
  else if (code == "InvalidAccessKeyId")
    hint = "the store does not know this access key id";
  else if (code == "ExpiredToken" || code == "InvalidToken")
    hint = "the session token is expired or invalid";
  else if (code == "NoSuchBucket")
    hint = "no such bucket";
  else if (code == "NoSuchKey" || r.status == 404)
    hint = "no such object";
  else if (code == "AccessDenied" || r.status == 403)
    hint = "access denied to these credentials";
  std::string text = "HTTP " + std::to_string(r.status) + (code.empty() ? "" : " " + code) +
                     (hint.empty() ? "" : ": " + hint) + (message.empty() ? "" : " (" + message + ")");
  throw Error(where, redact(text));
}

std::vector<S3Object> S3Client::list(const std::string& bucket, const std::string& prefix) {
  const std::string where = "s3://" + bucket + "/" + prefix;
  std::vector<S3Object> out;
  std::string token;
  for (int page = 0;; ++page) {
    std::vector<std::pair<std::string, std::string>> query = {
        {"list-type", "2"}, {"prefix", prefix}, {"max-keys", std::to_string(options_.max_keys)}};
    if (!token.empty()) query.emplace_back("continuation-token", token);
    HttpResponse r = perform_with_retries(
        http_, [&] { return signed_request("GET", bucket, "", query, kEmptySha256); }, options_.retry, where);
    if (r.status != 200) raise(r, where + ": list");
    size_t at = 0;
    while ((at = r.body.find("<Contents>", at)) != std::string::npos) {
      size_t end = r.body.find("</Contents>", at);
      if (end == std::string::npos) break;
      std::string block = r.body.substr(at, end - at);
      S3Object obj;
      auto keys = xml_elements(block, "Key");
      auto sizes = xml_elements(block, "Size");
      auto etags = xml_elements(block, "ETag");
      if (keys.empty()) throw Error(where, "a listed object has no <Key>");
      obj.key = keys[0];
      obj.size = sizes.empty() ? 0 : std::strtoull(sizes[0].c_str(), nullptr, 10);
      if (!etags.empty()) {
        obj.etag = etags[0];
        if (obj.etag.size() >= 2 && obj.etag.front() == '"') obj.etag = obj.etag.substr(1, obj.etag.size() - 2);
      }
      out.push_back(std::move(obj));
      at = end;
    }
    auto truncated = xml_elements(r.body, "IsTruncated");
    auto next = xml_elements(r.body, "NextContinuationToken");
    if (truncated.empty() || truncated[0] != "true") break;
    if (next.empty() || next[0].empty()) throw Error(where, "listing is truncated but has no continuation token");
    token = next[0];
  }
  return out;
}

// 32 hex digits: an MD5 as an ETag spells it.
static bool is_md5_hex(std::string_view s) {
  return s.size() == 32 && s.find_first_not_of("0123456789abcdefABCDEF") == std::string_view::npos;
}

// The size of a multipart object's first part (its ETag "<hex>-<parts>", parts > 1), from HEAD
// ?partNumber=1; 0 when the ETag is not a multipart one or the store does not say (then only the size
// is checked).
uint64_t S3Client::first_part_size(const std::string& bucket, const S3Object& o) {
  if (o.etag.size() < 34 || !is_md5_hex(std::string_view(o.etag).substr(0, 32)) || o.etag[32] != '-') return 0;
  const std::string parts = o.etag.substr(33);
  if (parts.empty() || parts.find_first_not_of("0123456789") != std::string::npos || std::stoull(parts) < 2) return 0;
  try {
    HttpResponse r = perform_with_retries(
        http_, [&] { return signed_request("HEAD", bucket, o.key, {{"partNumber", "1"}}, kEmptySha256); }, options_.retry,
        "s3://" + bucket + "/" + o.key);
    const std::string length = r.header("content-length");
    if (r.status != 206 && r.status != 200) return 0;
    if (!r.header("x-amz-mp-parts-count").empty() && r.header("x-amz-mp-parts-count") != parts) return 0;
    const uint64_t size = length.empty() ? 0 : std::strtoull(length.c_str(), nullptr, 10);
    return size > 0 && size < o.size ? size : 0;
  } catch (const Error& e) {
    log_debug("s3://" + bucket + "/" + o.key + ": no part size (" + e.what_only() + "): checked by size only");
    return 0;
  }
}

TransferReport S3Client::download(const std::string& bucket, const std::string& prefix_in,
                                  const PatternFilter& filter, const std::string& output_dir,
                                  const ProgressFn& progress) {
  auto t0 = std::chrono::steady_clock::now();
  std::string prefix = prefix_in;
  while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  const std::string origin = "s3://" + bucket + (prefix.empty() ? "" : "/" + prefix);
  std::vector<S3Object> objects = list(bucket, prefix);  // before the output folder is made: a refused listing leaves none
  TargetDir target(output_dir);
  RemoveCreatedDirsOnThrow cleanup(target);
  std::vector<std::pair<S3Object, std::string>> chosen;  // object, local relative name
  for (S3Object& o : objects) {
    if (!o.key.empty() && o.key.back() == '/') continue;  // folder marker
    std::string rel;
    if (prefix.empty()) rel = o.key;
    else if (o.key == prefix) rel = o.key.substr(o.key.rfind('/') == std::string::npos ? 0 : o.key.rfind('/') + 1);
    else if (o.key.size() > prefix.size() && o.key.compare(0, prefix.size(), prefix) == 0 && o.key[prefix.size()] == '/')
      rel = o.key.substr(prefix.size() + 1);
    else continue;  // "prefix-other": same characters, another folder
    if (!filter.keeps(rel)) continue;
    chosen.emplace_back(std::move(o), rel);
  }
  for (const auto& c : chosen) target.resolve(c.second, origin);
  if (chosen.empty()) throw Error(origin, "no object under that prefix passes the allow/ignore patterns");
  TransferReport report;
  report.source = origin;
  report.destination = target.root();
  std::vector<DownloadJob> jobs;
  for (const auto& [o, rel] : chosen) {
    DownloadJob& job = jobs.emplace_back();
    job.origin = origin;
    job.name = rel;
    job.version_tag = o.etag;
    job.expected.size = int64_t(o.size);
    // A single-part object's ETag is the MD5 of its bytes; a multipart one's is "<md5 of the parts'
    // MD5s>-<parts>", checked with the size of its first part (HEAD ?partNumber=1: uploaders cut
    // equal parts but the last). Objects encrypted with SSE-KMS or SSE-C have other ETags: their
    // responses say so, and the check is dropped.
    if (is_md5_hex(o.etag)) {
      job.expected.md5 = o.etag;
    } else if (const uint64_t part = first_part_size(bucket, o); part > 0) {
      job.expected.multipart_md5 = o.etag;
      job.expected.part_size = part;
    }
    std::string key = o.key;
    job.make_request = [this, bucket, key](uint64_t) { return signed_request("GET", bucket, key, {}, kEmptySha256); };
    const std::string where = "s3://" + bucket + "/" + key;
    job.explain_error = [this, where](const HttpResponse& r) { raise(r, where); };
    job.adjust_expected = [](const HttpResponse& r, ExpectedContent& expected) {
      const std::string sse = r.header("x-amz-server-side-encryption");
      if (sse == "aws:kms" || sse == "aws:kms:dsse" || !r.header("x-amz-server-side-encryption-customer-algorithm").empty()) {
        expected.md5.clear();
        expected.multipart_md5.clear();
      }
    };
  }
  download_all(http_, target, jobs, options_.retry, origin, report, progress);
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

static uint64_t file_size_or_throw(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) throw Error(path, "not a readable file");
  return uint64_t(st.st_size);
}

void S3Client::put_file(const std::string& bucket, const std::string& key, const std::string& local_path) {
  uint64_t size = file_size_or_throw(local_path);
  if (size > options_.multipart_threshold) return put_multipart(bucket, key, local_path, size);
  const std::string where = "s3://" + bucket + "/" + key;
  std::string hash = sha256_file_hex(local_path);
  HttpResponse r = perform_with_retries(
      http_,
      [&] {
        HttpRequest req = signed_request("PUT", bucket, key, {}, hash);
        req.upload_path = local_path;
        return req;
      },
      options_.retry, where);
  if (r.status != 200) raise(r, where + ": put");
}

void S3Client::put_multipart(const std::string& bucket, const std::string& key, const std::string& local_path,
                             uint64_t size) {
  const std::string where = "s3://" + bucket + "/" + key;
  HttpResponse c = perform_with_retries(
      http_, [&] { return signed_request("POST", bucket, key, {{"uploads", ""}}, kEmptySha256); }, options_.retry,
      where + ": create multipart upload");
  if (c.status != 200) raise(c, where + ": create multipart upload");
  auto ids = xml_elements(c.body, "UploadId");
  if (ids.empty()) throw Error(where, "create multipart upload answered without an UploadId");
  const std::string upload_id = ids[0];
  try {
    std::string complete = "<CompleteMultipartUpload>";
    int part = 0;
    for (uint64_t offset = 0; offset < size; offset += options_.part_size) {
      ++part;
      uint64_t length = std::min(options_.part_size, size - offset);
      std::string hash = sha256_file_range_hex(local_path, offset, length);
      std::vector<std::pair<std::string, std::string>> q = {{"partNumber", std::to_string(part)},
                                                            {"uploadId", upload_id}};
      HttpResponse r = perform_with_retries(
          http_,
          [&] {
            HttpRequest req = signed_request("PUT", bucket, key, q, hash);
            req.upload_path = local_path;
            req.upload_offset = offset;
            req.upload_length = length;
            return req;
          },
          options_.retry, where + ": part " + std::to_string(part));
      if (r.status != 200) raise(r, where + ": part " + std::to_string(part));
      std::string etag = r.header("etag");
      if (etag.empty()) throw Error(where, "part " + std::to_string(part) + " was stored without an ETag");
      std::string quoted = etag.front() == '"' ? etag : "\"" + etag + "\"";
      complete += "<Part><PartNumber>" + std::to_string(part) + "</PartNumber><ETag>" + quoted + "</ETag></Part>";
    }
    complete += "</CompleteMultipartUpload>";
    std::string hash = sha256_hex(complete);
    HttpResponse r = perform_with_retries(
        http_,
        [&] {
          HttpRequest req = signed_request("POST", bucket, key, {{"uploadId", upload_id}}, hash);
          req.body = complete;
          req.headers.emplace_back("Content-Type", "application/xml");
          return req;
        },
        options_.retry, where + ": complete multipart upload");
    // S3 may answer 200 with an <Error> body when completion fails late.
    if (r.status != 200 || r.body.find("<Error>") != std::string::npos) raise(r, where + ": complete multipart upload");
  } catch (...) {
    try {
      const TransferInterrupt uninterrupted(nullptr);  // the abort must go out even when the caller interrupted
      http_.perform(signed_request("DELETE", bucket, key, {{"uploadId", upload_id}}, kEmptySha256));
    } catch (...) {
    }
    throw;
  }
}

TransferReport S3Client::upload(const std::string& bucket, const std::string& prefix_in,
                                const std::vector<UploadItem>& files, const ProgressFn& progress) {
  auto t0 = std::chrono::steady_clock::now();
  std::string prefix = prefix_in;
  while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  TransferReport report;
  report.source = "";
  report.destination = "s3://" + bucket + (prefix.empty() ? "" : "/" + prefix);
  for (size_t i = 0; i < files.size(); ++i) {
    check_relative_name(files[i].remote_path, report.destination);
    std::string key = prefix.empty() ? files[i].remote_path : prefix + "/" + files[i].remote_path;
    put_file(bucket, key, files[i].local_path);
    uint64_t bytes = file_size_or_throw(files[i].local_path);
    report.bytes_transferred += bytes;
    report.files.push_back({files[i].remote_path, bytes, FetchOutcome::Downloaded});
    if (progress) progress(i + 1, files.size(), report.files.back());
  }
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

}  // namespace ktune::hub
