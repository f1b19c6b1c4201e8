// AWS Signature Version 4, as S3 and S3-compatible stores check it: the canonical request
// (method, URI, sorted query, signed headers, payload hash), the string to sign over the
// date/region/service scope, the HMAC key chain, and the Authorization header. Pure functions of
// their inputs (the time is passed in) so that known answers can be checked in tests.
// It deliberately does not do presigned URLs, chunked (streaming) payload signing, or SigV4a.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "hub/http_client.h"

namespace ktune::hub {

struct AwsCredentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // optional (temporary credentials)
};

struct SigV4Input {
  std::string method;         // "GET"
  std::string host;           // Host header value: host[:port] (port only when not the scheme's default)
  std::string canonical_uri;  // already percent-encoded path, e.g. "/bucket/a%20b.txt"
  std::vector<std::pair<std::string, std::string>> query;  // raw (unencoded) names and values
  Headers headers;            // other headers to sign (names any case)
  std::string payload_sha256; // hex sha256 of the body, or "UNSIGNED-PAYLOAD"
  std::string region = "us-east-1";
  std::string service = "s3";
  std::string amz_date;       // "20150830T123600Z"
};

// Encodes a query the way SigV4 wants it (and the URL must carry it): names and values percent-
// encoded (RFC 3986 unreserved kept), sorted by name then value, joined with '&'.
std::string sigv4_canonical_query(const std::vector<std::pair<std::string, std::string>>& query);
std::string sigv4_canonical_request(const SigV4Input& in, std::string* signed_headers = nullptr);
std::string sigv4_string_to_sign(const SigV4Input& in);
std::string sigv4_signature(const SigV4Input& in, const AwsCredentials& credentials);

// The headers to add to the request: Host, X-Amz-Date, X-Amz-Content-Sha256 (service s3),
// X-Amz-Security-Token (when a session token is set) and Authorization. `in.headers` are signed
// too, and must also be sent.
Headers sigv4_sign(SigV4Input in, const AwsCredentials& credentials);

std::string amz_date_now();  // current UTC time as "YYYYMMDDTHHMMSSZ"

// The Host header a signer sends for "scheme://host[:port][/path]": host[:port], the scheme's
// default port left out (that is what clients send and stores sign against). Throws an Error
// naming `what` when the URL has no scheme.
std::string sigv4_host_of(const std::string& base_url, const std::string& what);

}  // namespace ktune::hub
