// An S3 client for the initializers and the exporter: ListObjectsV2 (with continuation-token
// pagination), GetObject through the shared download discipline (partial file, Range resume,
// size check, atomic rename), PutObject for one request and the multipart upload API above a
// threshold. Every request is SigV4-signed with fresh time, including a session token when one is
// given. Custom endpoints (MinIO, moto, Ceph) are addressed path-style (endpoint/bucket/key);
// AWS itself virtual-hosted (bucket.s3.region.amazonaws.com) unless the bucket name has a dot.
// Credentials: an access key (env vars, flags), or a role's temporary ones through STS
// (sts_client.h): role_arn assumed with the key, or with a pod's web identity token (EKS IRSA).
// The environment first, then the AWS profile's files (~/.aws/config and credentials: aws_config.h).
// It deliberately does not do: the rest of the AWS credential chain (no SSO, no instance
// metadata), SSE-C, S3 Express, or checksum headers; and it
// checks downloads by size only (an ETag is an MD5 only for some encryption modes).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "hub/env_lookup.h"
#include "hub/http_client.h"
#include "hub/patterns.h"
#include "hub/sigv4.h"
#include "hub/sts_client.h"
#include "hub/transfer.h"

namespace ktune::hub {

// Which AWS profile fills what S3Options leaves unset, when the client is made (aws_config.h): no
// file named, none.
struct AwsProfileChoice {
  std::string name = "default";
  bool asked_for = false;  // by AWS_PROFILE / AWS_DEFAULT_PROFILE: a profile neither file holds is an Error
  std::string config_file, credentials_file;
};

struct S3Options {
  std::string endpoint;  // "" → https://s3.<region>.amazonaws.com
  std::string region;     // "" → the profile's, else us-east-1
  AwsCredentials credentials;
  // A role to assume (the S3 initializer's role_arn, upstream's ROLE_ARN; --role-arn): with
  // `credentials` (AssumeRole), or without them with the web identity token
  // (AssumeRoleWithWebIdentity, through web_identity_role_arn when that is another role).
  std::string role_arn;
  std::string role_external_id;                 // AssumeRole's ExternalId (an AWS profile's external_id)
  // EKS's IAM roles for service accounts (AWS_ROLE_ARN, AWS_WEB_IDENTITY_TOKEN_FILE): the role
  // used when there is neither role_arn nor an access key. The token file is read at each fetch
  // (the kubelet rotates it).
  std::string web_identity_role_arn;
  std::string web_identity_token_file;
  std::string sts_endpoint;                     // AWS_ENDPOINT_URL_STS (see sts_client.h for the default)
  std::string role_session_name;                // AWS_ROLE_SESSION_NAME, else the profile's, else "ktune"
  AwsProfileChoice profile;                     // AWS_PROFILE's files (s3_roles_from_env)
  RetryPolicy retry;
  uint64_t multipart_threshold = 64ull << 20;  // files above this go up in parts
  uint64_t part_size = 16ull << 20;            // >= 5 MiB (S3's minimum for all but the last)
  int max_keys = 1000;                         // page size of a listing
};

// From AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, AWS_REGION / AWS_DEFAULT_REGION,
// AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN (secrets are registered) and the
// role's variables and profile (s3_roles_from_env). What they leave unset the profile fills when
// the client is made (after any flags); the region is then us-east-1 when none names one.
S3Options s3_options_from_env(const EnvLookup& env = &std::getenv);

// The AWS SDKs' role settings of S3Options from the environment: AWS_ROLE_ARN +
// AWS_WEB_IDENTITY_TOKEN_FILE, AWS_ENDPOINT_URL_STS (else AWS_ENDPOINT_URL), AWS_ROLE_SESSION_NAME,
// and the profile: AWS_PROFILE (else AWS_DEFAULT_PROFILE, else default) in AWS_CONFIG_FILE and
// AWS_SHARED_CREDENTIALS_FILE (else ~/.aws/config and ~/.aws/credentials under HOME).
// (The initializers read upstream's ROLE_ARN as well; the CLI takes --role-arn.)
void s3_roles_from_env(S3Options& options, const EnvLookup& env);

struct S3Object {
  std::string key;
  uint64_t size = 0;
  std::string etag;  // without quotes
};

class S3Client {
 public:
  explicit S3Client(S3Options options);

  // All objects whose key starts with `prefix` (every page).
  std::vector<S3Object> list(const std::string& bucket, const std::string& prefix);

  // The objects under `prefix` (a folder: keys "prefix/…", or one key equal to prefix) that pass
  // `filter`, into output_dir at their path relative to the prefix folder.
  TransferReport download(const std::string& bucket, const std::string& prefix, const PatternFilter& filter,
                          const std::string& output_dir, const ProgressFn& progress = nullptr);

  void put_file(const std::string& bucket, const std::string& key, const std::string& local_path);
  TransferReport upload(const std::string& bucket, const std::string& prefix, const std::vector<UploadItem>& files,
                        const ProgressFn& progress = nullptr);

 private:
  struct Target {
    std::string url_base;  // scheme://host[:port][/bucket]
    std::string host;      // Host header value
    std::string path_prefix;  // "/bucket" (path-style) or ""
  };
  Target target_for(const std::string& bucket) const;
  uint64_t first_part_size(const std::string& bucket, const S3Object& o);
  HttpRequest signed_request(const std::string& method, const std::string& bucket, const std::string& key,
                             const std::vector<std::pair<std::string, std::string>>& query,
                             const std::string& payload_sha256) const;
  [[noreturn]] void raise(const HttpResponse& r, const std::string& where) const;
  void put_multipart(const std::string& bucket, const std::string& key, const std::string& local_path, uint64_t size);

  S3Options options_;
  std::shared_ptr<CredentialSource> credentials_;  // the key, or a role's credentials refreshed near expiry
  HttpClient http_;
};

// Text of each <tag>…</tag> in `xml` (not nested in itself), entities decoded.
std::vector<std::string> xml_elements(const std::string& xml, const std::string& tag);

}  // namespace ktune::hub
