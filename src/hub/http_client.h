// One HTTP(S) exchange over libcurl, with the redirect and retry rules every store client here
// shares. Redirects are followed by hand so the first response's headers (the Hub's
// X-Repo-Commit, X-Linked-Etag) stay visible and Authorization is dropped when a redirect leaves
// the original host (the Hub sends LFS files to a CDN that must not see the token). Retries
// (429 and 5xx, transport failures) back off exponentially and honour Retry-After.
// It deliberately does not parse bodies, sign requests or know any store's URL layout; nor does
// it retry on its own inside perform(): callers decide, because a download must resume with a
// new Range header on each attempt.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.h"

namespace ktune::hub {

using Headers = std::vector<std::pair<std::string, std::string>>;

// TLS settings beyond the system's CA store (a Kubernetes API server's own CA, client
// certificates). PEM text or file paths; text wins when both are set.
struct TlsOptions {
  std::string ca_pem, ca_file;                   // trust these CAs instead of the system's
  std::string client_cert_pem, client_cert_file; // mutual TLS
  std::string client_key_pem, client_key_file;
  bool insecure_skip_verify = false;             // kubeconfig's insecure-skip-tls-verify
};

struct HttpRequest {
  std::string method = "GET";
  std::string url;
  Headers headers;
  std::string body;            // sent for methods other than GET/HEAD when upload_path is empty
  std::string upload_path;     // a file streamed as the body instead
  uint64_t upload_offset = 0;  // the slice of upload_path to send (multipart parts)
  uint64_t upload_length = UINT64_MAX;
  bool follow_redirects = true;
  TlsOptions tls;
  bool streaming = false;      // a long poll (a followed log): no stalled-transfer limit
};

struct HttpResponse {
  long status = 0;
  std::string url;                                  // final URL, after redirects
  std::map<std::string, std::string> headers;       // final response; names lower-cased
  std::map<std::string, std::string> first_headers; // the first response, before any redirect
  std::string body;                                 // unless a sink took it; capped at 1 MiB

  // Value of a header of the final response, or of the first one when absent there ("" if none).
  std::string header(const std::string& lower_name) const;
};

// Receives the body of a 2xx response; begin() is called once before the first write.
class BodySink {
 public:
  virtual ~BodySink() = default;
  virtual void begin(const HttpResponse& head) = 0;
  virtual void write(const char* data, size_t size) = 0;
};

// A failure below HTTP (connect, reset, timeout, truncated body): maybe worth another attempt.
class TransportError : public Error {
 public:
  TransportError(const std::string& where, const std::string& what, bool retryable)
      : Error(where, what), retryable_(retryable) {}
  bool retryable() const { return retryable_; }

 private:
  bool retryable_;
};

class HttpClient {
 public:
  HttpClient();
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // One request, following up to 10 redirects. Throws TransportError; never throws on a status.
  HttpResponse perform(const HttpRequest& request, BodySink* sink = nullptr);

 private:
  HttpResponse perform_once(const HttpRequest& request, BodySink* sink);
  void* curl_;
};

// A check asked between the pieces of this thread's transfers while the TransferInterrupt lives:
// from curl's progress callback (at most every 100 ms), between retries and through their delays,
// and between files and the 64 MiB pieces of a local copy. What it throws ends the transfer at once
// and is rethrown to the caller; the file never takes its real name (a download's partial file
// stays for a resume, a local copy's is removed). A Python notebook's Ctrl-C ends an export
// mid-file. Nested ones: the innermost asks; one made with no check turns asking off (cleanup that
// must go out, such as a multipart upload's abort).
class TransferInterrupt {
 public:
  explicit TransferInterrupt(std::function<void()> check);
  ~TransferInterrupt();
  TransferInterrupt(const TransferInterrupt&) = delete;
  TransferInterrupt& operator=(const TransferInterrupt&) = delete;
  // Runs this thread's current check (nothing when none lives).
  static void check();
  static bool active();

 private:
  std::function<void()> check_;
  TransferInterrupt* outer_;
};

struct RetryPolicy {
  int max_attempts = 5;         // total attempts, first included
  double base_delay_s = 0.5;    // delay after the first failure; doubles each time
  double max_delay_s = 20.0;    // cap of the exponential delay
  double max_retry_after_s = 120.0;  // cap on what a server's Retry-After may ask for
};

bool is_retryable_status(long status);  // 408, 429, 500, 502, 503, 504
// Delay before attempt `failed_attempts + 1`: Retry-After (seconds or HTTP-date) when the
// response has one, else base * 2^(failed_attempts-1), both capped.
double retry_delay_seconds(const RetryPolicy& policy, int failed_attempts, const HttpResponse* response);
void sleep_seconds(double seconds);  // in slices, asking TransferInterrupt::check() between them

// Sends make_request() until a non-retryable answer or the attempts run out; returns the last
// response (its status may be an error for the caller to explain). `what` names it in errors.
HttpResponse perform_with_retries(HttpClient& client, const std::function<HttpRequest()>& make_request,
                                  const RetryPolicy& policy, const std::string& what);

// Percent-encodes everything but RFC 3986 unreserved characters (and '/' when keep_slash).
std::string url_encode(std::string_view s, bool keep_slash);

// scheme://host[:port] of a URL ("" when it cannot be parsed).
std::string url_origin(const std::string& url);

}  // namespace ktune::hub
