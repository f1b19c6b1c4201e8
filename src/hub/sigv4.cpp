#include "hub/sigv4.h"

#include <algorithm>
#include <cctype>
#include <ctime>

#include "core/error.h"
#include "hub/digest.h"

namespace ktune::hub {

static std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return s;
}

// Header values are trimmed and inner runs of spaces collapsed.
static std::string canonical_value(const std::string& v) {
  std::string out;
  bool space = false;
  for (char c : v) {
    if (c == ' ' || c == '\t') {
      space = !out.empty();
      continue;
    }
    if (space) out.push_back(' ');
    space = false;
    out.push_back(c);
  }
  return out;
}

std::string sigv4_canonical_query(const std::vector<std::pair<std::string, std::string>>& query) {
  std::vector<std::pair<std::string, std::string>> enc;
  for (const auto& [k, v] : query) enc.emplace_back(url_encode(k, false), url_encode(v, false));
  std::sort(enc.begin(), enc.end());
  std::string out;
  for (const auto& [k, v] : enc) out += (out.empty() ? "" : "&") + k + "=" + v;
  return out;
}

static Headers all_signed_headers(const SigV4Input& in) {
  Headers h;
  h.emplace_back("host", in.host);
  h.emplace_back("x-amz-date", in.amz_date);
  for (const auto& [k, v] : in.headers) {
    std::string name = lower(k);
    if (name != "host" && name != "x-amz-date") h.emplace_back(name, canonical_value(v));
  }
  std::sort(h.begin(), h.end());
  return h;
}

std::string sigv4_canonical_request(const SigV4Input& in, std::string* signed_headers) {
  Headers h = all_signed_headers(in);
  std::string canonical_headers, names;
  for (const auto& [k, v] : h) {
    canonical_headers += k + ":" + v + "\n";
    names += (names.empty() ? "" : ";") + k;
  }
  if (signed_headers != nullptr) *signed_headers = names;
  return in.method + "\n" + (in.canonical_uri.empty() ? "/" : in.canonical_uri) + "\n" +
         sigv4_canonical_query(in.query) + "\n" + canonical_headers + "\n" + names + "\n" + in.payload_sha256;
}

static std::string scope_of(const SigV4Input& in) {
  return in.amz_date.substr(0, 8) + "/" + in.region + "/" + in.service + "/aws4_request";
}

std::string sigv4_string_to_sign(const SigV4Input& in) {
  return "AWS4-HMAC-SHA256\n" + in.amz_date + "\n" + scope_of(in) + "\n" + sha256_hex(sigv4_canonical_request(in));
}

std::string sigv4_signature(const SigV4Input& in, const AwsCredentials& credentials) {
  std::string k_date = hmac_sha256("AWS4" + credentials.secret_access_key, in.amz_date.substr(0, 8));
  std::string k_region = hmac_sha256(k_date, in.region);
  std::string k_service = hmac_sha256(k_region, in.service);
  std::string k_signing = hmac_sha256(k_service, "aws4_request");
  return to_hex(hmac_sha256(k_signing, sigv4_string_to_sign(in)));
}

Headers sigv4_sign(SigV4Input in, const AwsCredentials& credentials) {
  Headers out;
  if (in.service == "s3") {
    in.headers.emplace_back("x-amz-content-sha256", in.payload_sha256);
    out.emplace_back("x-amz-content-sha256", in.payload_sha256);
  }
  if (!credentials.session_token.empty()) {
    in.headers.emplace_back("x-amz-security-token", credentials.session_token);
    out.emplace_back("x-amz-security-token", credentials.session_token);
  }
  std::string signed_headers;
  sigv4_canonical_request(in, &signed_headers);
  std::string signature = sigv4_signature(in, credentials);
  out.emplace_back("Host", in.host);
  out.emplace_back("x-amz-date", in.amz_date);
  out.emplace_back("Authorization", "AWS4-HMAC-SHA256 Credential=" + credentials.access_key_id + "/" + scope_of(in) +
                                        ", SignedHeaders=" + signed_headers + ", Signature=" + signature);
  return out;
}

std::string sigv4_host_of(const std::string& base_url, const std::string& what) {
  const size_t scheme_end = base_url.find("://");
  if (scheme_end == std::string::npos) throw Error(what + " '" + base_url + "'", "expected http(s)://host[:port]");
  const std::string scheme = base_url.substr(0, scheme_end);
  std::string host = base_url.substr(scheme_end + 3);
  host = host.substr(0, host.find('/'));
  if ((scheme == "http" && host.size() > 3 && host.compare(host.size() - 3, 3, ":80") == 0) ||
      (scheme == "https" && host.size() > 4 && host.compare(host.size() - 4, 4, ":443") == 0))
    host = host.substr(0, host.rfind(':'));
  return host;
}

std::string amz_date_now() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%dT%H%M%SZ", &tm);
  return buf;
}

}  // namespace ktune::hub
