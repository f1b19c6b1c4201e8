// AWS STS, for S3 access through a role: AssumeRole (signed with the credentials at hand: the S3
// initializer's role_arn, upstream's ROLE_ARN) and AssumeRoleWithWebIdentity (a pod's projected
// service-account token: EKS's IAM roles for service accounts, AWS_ROLE_ARN +
// AWS_WEB_IDENTITY_TOKEN_FILE). Both return temporary credentials (key, secret, session token,
// expiry); S3Client asks again before they expire. The STS endpoint is AWS_ENDPOINT_URL_STS, else
// AWS_ENDPOINT_URL, else the S3 store's own when it is not AWS (MinIO serves STS there), else
// https://sts.<region>.amazonaws.com.
// It deliberately does not do: MFA, session policies or tags, chains of profiles' roles
// (aws_config.h), or the instance metadata service.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

#include "hub/http_client.h"
#include "hub/sigv4.h"

namespace ktune::hub {

struct TemporaryCredentials {
  AwsCredentials credentials;
  int64_t expires_at = 0;  // unix seconds (an answer naming none: now + the duration asked for)
};

struct StsOptions {
  std::string endpoint;  // "" → https://sts.<region>.amazonaws.com
  std::string region = "us-east-1";
  std::string session_name = "ktune";  // RoleSessionName: 2 to 64 of [A-Za-z0-9+=,.@_-]
  std::string external_id;              // AssumeRole's ExternalId, when the role's trust policy asks for one
  int duration_seconds = 3600;
  RetryPolicy retry;
};

// AssumeRole, signed (SigV4, service sts) with `source`. Throws an Error naming the role and STS's
// own code and message when refused.
TemporaryCredentials sts_assume_role(const StsOptions& options, const AwsCredentials& source, const std::string& role_arn);

// AssumeRoleWithWebIdentity with a JWT (unsigned: the token is the proof).
TemporaryCredentials sts_assume_role_with_web_identity(const StsOptions& options, const std::string& role_arn,
                                                       const std::string& web_identity_token);

// The credentials a client signs with: fixed ones, or a role's, fetched again five minutes before
// they expire. Safe to call from several threads.
class CredentialSource {
 public:
  explicit CredentialSource(AwsCredentials fixed);
  // `fetch` gets a role's credentials (called now, and again near each expiry).
  explicit CredentialSource(std::function<TemporaryCredentials()> fetch);
  AwsCredentials current();

 private:
  std::mutex mutex_;
  std::function<TemporaryCredentials()> fetch_;  // empty: fixed credentials
  TemporaryCredentials held_;
};

}  // namespace ktune::hub
