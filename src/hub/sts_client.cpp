#include "hub/sts_client.h"

#include <chrono>
#include <ctime>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "core/rfc3339.h"
#include "hub/digest.h"
#include "hub/s3_client.h"

namespace ktune::hub {

namespace {

constexpr const char* kStsVersion = "2011-06-15";

std::string endpoint_of(const StsOptions& options) {
  std::string e = options.endpoint.empty() ? "https://sts." + options.region + ".amazonaws.com" : options.endpoint;
  while (!e.empty() && e.back() == '/') e.pop_back();
  return e;
}

// A form body as STS's query API takes it (application/x-www-form-urlencoded).
std::string form_body(const std::vector<std::pair<std::string, std::string>>& fields) {
  std::string body;
  for (const auto& [k, v] : fields) {
    if (!body.empty()) body += '&';
    body += url_encode(k, false);
    body += '=';
    body += url_encode(v, false);
  }
  return body;
}

// The <Credentials> of an AssumeRole* answer, or an Error with STS's code and message. An answer
// without a readable <Expiration> is taken to last the duration asked for (from now), so that the
// credentials are still fetched again in time.
TemporaryCredentials read_answer(const HttpResponse& r, const std::string& where, int duration_seconds) {
  if (r.status != 200) {
    const std::vector<std::string> codes = xml_elements(r.body, "Code"), messages = xml_elements(r.body, "Message");
    throw Error(where, redact("STS refused: HTTP " + std::to_string(r.status) + (codes.empty() ? "" : " " + codes[0]) +
                              (messages.empty() ? "" : " (" + messages[0] + ")")));
  }
  const std::vector<std::string> block = xml_elements(r.body, "Credentials");
  if (block.empty()) throw Error(where, "STS answered without <Credentials>");
  const auto one = [&](const char* tag) {
    const std::vector<std::string> v = xml_elements(block[0], tag);
    if (v.empty() || v[0].empty()) throw Error(where, std::string("STS answered without <") + tag + ">");
    return v[0];
  };
  TemporaryCredentials t;
  t.credentials.access_key_id = one("AccessKeyId");
  t.credentials.secret_access_key = one("SecretAccessKey");
  t.credentials.session_token = one("SessionToken");
  register_secret(t.credentials.secret_access_key);
  register_secret(t.credentials.session_token);
  const std::vector<std::string> expiration = xml_elements(block[0], "Expiration");
  if (!expiration.empty()) t.expires_at = int64_t(parse_rfc3339(expiration[0]));
  if (t.expires_at <= 0) t.expires_at = int64_t(std::time(nullptr)) + duration_seconds;
  return t;
}

TemporaryCredentials call_sts(const StsOptions& options, const std::vector<std::pair<std::string, std::string>>& fields,
                              const AwsCredentials* signer, const std::string& where) {
  const std::string endpoint = endpoint_of(options);
  const std::string body = form_body(fields);
  HttpClient http;
  const HttpResponse r = perform_with_retries(
      http,
      [&] {
        HttpRequest req;
        req.method = "POST";
        req.url = endpoint + "/";
        req.body = body;
        req.headers.emplace_back("Content-Type", "application/x-www-form-urlencoded; charset=utf-8");
        if (signer != nullptr) {
          SigV4Input in;
          in.method = "POST";
          in.host = sigv4_host_of(endpoint, "STS endpoint");
          in.canonical_uri.push_back('/');  // not = "/": GCC 12's -Wrestrict misfires on that here
          in.headers = req.headers;
          in.payload_sha256 = sha256_hex(body);
          in.region = options.region;
          in.service = "sts";
          in.amz_date = amz_date_now();
          for (auto& h : sigv4_sign(in, *signer)) req.headers.push_back(std::move(h));
        }
        return req;
      },
      options.retry, where);
  return read_answer(r, where, options.duration_seconds);
}

}  // namespace

TemporaryCredentials sts_assume_role(const StsOptions& options, const AwsCredentials& source, const std::string& role_arn) {
  const std::string where = "assuming role " + role_arn;
  if (source.access_key_id.empty() || source.secret_access_key.empty())
    throw Error(where, "no credentials to assume it with: set an access key (ACCESS_KEY_ID/SECRET_ACCESS_KEY or "
                       "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY), or run where AWS_WEB_IDENTITY_TOKEN_FILE is set");
  std::vector<std::pair<std::string, std::string>> fields = {
      {"Action", "AssumeRole"}, {"Version", kStsVersion}, {"RoleArn", role_arn},
      {"RoleSessionName", options.session_name}, {"DurationSeconds", std::to_string(options.duration_seconds)}};
  if (!options.external_id.empty()) fields.emplace_back("ExternalId", options.external_id);
  return call_sts(options, fields, &source, where);
}

TemporaryCredentials sts_assume_role_with_web_identity(const StsOptions& options, const std::string& role_arn,
                                                       const std::string& web_identity_token) {
  register_secret(web_identity_token);
  return call_sts(options,
                  {{"Action", "AssumeRoleWithWebIdentity"}, {"Version", kStsVersion}, {"RoleArn", role_arn},
                   {"RoleSessionName", options.session_name}, {"WebIdentityToken", web_identity_token},
                   {"DurationSeconds", std::to_string(options.duration_seconds)}},
                  nullptr, "assuming role " + role_arn + " with the web identity token");
}

CredentialSource::CredentialSource(AwsCredentials fixed) { held_.credentials = std::move(fixed); }

CredentialSource::CredentialSource(std::function<TemporaryCredentials()> fetch) : fetch_(std::move(fetch)) {
  held_ = fetch_();
}

AwsCredentials CredentialSource::current() {
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t now = int64_t(std::time(nullptr));
  if (fetch_ && held_.expires_at > 0 && now >= held_.expires_at - 300) held_ = fetch_();
  return held_.credentials;
}

}  // namespace ktune::hub
