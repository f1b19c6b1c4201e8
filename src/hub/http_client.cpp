#include "hub/http_client.h"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>

#include "core/log.h"

namespace ktune::hub {

static constexpr size_t kMaxErrorBody = 1 << 20;
static constexpr int kMaxRedirects = 10;

std::string HttpResponse::header(const std::string& lower_name) const {
  auto it = headers.find(lower_name);
  if (it != headers.end()) return it->second;
  it = first_headers.find(lower_name);
  return it != first_headers.end() ? it->second : std::string();
}

static void global_init() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

HttpClient::HttpClient() {
  global_init();
  curl_ = curl_easy_init();
  if (curl_ == nullptr) throw Error("http", "libcurl could not create a handle");
}

HttpClient::~HttpClient() { curl_easy_cleanup(static_cast<CURL*>(curl_)); }

namespace {

struct Exchange {
  CURL* curl = nullptr;
  HttpResponse response;
  BodySink* sink = nullptr;
  bool started = false;
  bool to_sink = false;
  std::exception_ptr sink_error;
  std::chrono::steady_clock::time_point last_interrupt_check;  // on_progress asks at most every 100 ms
  // upload slice
  FILE* upload = nullptr;
  uint64_t upload_left = 0;
};

// curl's progress callback while a TransferInterrupt lives: its check's exception is kept for
// perform_once to rethrow, and a non-zero return aborts the transfer.
int on_progress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  auto* ex = static_cast<Exchange*>(user);
  const auto now = std::chrono::steady_clock::now();
  if (now - ex->last_interrupt_check < std::chrono::milliseconds(100)) return 0;
  ex->last_interrupt_check = now;
  try {
    TransferInterrupt::check();
    return 0;
  } catch (...) {
    ex->sink_error = std::current_exception();
    return 1;
  }
}

size_t on_header(char* data, size_t size, size_t n, void* user) {
  auto* ex = static_cast<Exchange*>(user);
  std::string line(data, size * n);
  while (!line.empty() && (line.back() == '\r' || line.back() == '\n')) line.pop_back();
  if (line.rfind("HTTP/", 0) == 0) {  // a new response (e.g. after 100 Continue)
    ex->response.headers.clear();
    return size * n;
  }
  size_t colon = line.find(':');
  if (colon == std::string::npos) return size * n;
  std::string name = line.substr(0, colon);
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  size_t v = colon + 1;
  while (v < line.size() && (line[v] == ' ' || line[v] == '\t')) ++v;
  ex->response.headers[name] = line.substr(v);
  return size * n;
}

size_t on_body(char* data, size_t size, size_t n, void* user) {
  auto* ex = static_cast<Exchange*>(user);
  size_t bytes = size * n;
  if (!ex->started) {
    ex->started = true;
    curl_easy_getinfo(ex->curl, CURLINFO_RESPONSE_CODE, &ex->response.status);
    ex->to_sink = ex->sink != nullptr && ex->response.status >= 200 && ex->response.status < 300;
    if (ex->to_sink) {
      try {
        ex->sink->begin(ex->response);
      } catch (...) {
        ex->sink_error = std::current_exception();
        return 0;
      }
    }
  }
  if (ex->to_sink) {
    try {
      ex->sink->write(data, bytes);
    } catch (...) {
      ex->sink_error = std::current_exception();
      return 0;
    }
  } else if (ex->response.body.size() < kMaxErrorBody) {
    ex->response.body.append(data, std::min(bytes, kMaxErrorBody - ex->response.body.size()));
  }
  return bytes;
}

size_t on_read(char* buffer, size_t size, size_t n, void* user) {
  auto* ex = static_cast<Exchange*>(user);
  size_t want = std::min<uint64_t>(size * n, ex->upload_left);
  if (want == 0) return 0;
  size_t got = std::fread(buffer, 1, want, ex->upload);
  if (got == 0) return CURL_READFUNC_ABORT;
  ex->upload_left -= got;
  return got;
}

bool retryable_curl_code(CURLcode code) {
  switch (code) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_PARTIAL_FILE:
    case CURLE_GOT_NOTHING:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_COULDNT_RESOLVE_HOST:
      return true;
    default:
      return false;
  }
}

// Resolves `location` against `base` (absolute or relative Location headers).
std::string resolve_url(const std::string& base, const std::string& location) {
  CURLU* u = curl_url();
  std::string out = location;
  if (curl_url_set(u, CURLUPART_URL, base.c_str(), 0) == CURLUE_OK &&
      curl_url_set(u, CURLUPART_URL, location.c_str(), 0) == CURLUE_OK) {
    char* s = nullptr;
    if (curl_url_get(u, CURLUPART_URL, &s, 0) == CURLUE_OK) {
      out = s;
      curl_free(s);
    }
  }
  curl_url_cleanup(u);
  return out;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return s;
}

}  // namespace

std::string url_origin(const std::string& url) {
  CURLU* u = curl_url();
  std::string out;
  if (curl_url_set(u, CURLUPART_URL, url.c_str(), 0) == CURLUE_OK) {
    char *scheme = nullptr, *host = nullptr, *port = nullptr;
    curl_url_get(u, CURLUPART_SCHEME, &scheme, 0);
    curl_url_get(u, CURLUPART_HOST, &host, 0);
    curl_url_get(u, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT);
    if (scheme && host) out = lower(scheme) + "://" + lower(host) + ":" + (port ? port : "");
    curl_free(scheme);
    curl_free(host);
    curl_free(port);
  }
  curl_url_cleanup(u);
  return out;
}

HttpResponse HttpClient::perform_once(const HttpRequest& request, BodySink* sink) {
  CURL* curl = static_cast<CURL*>(curl_);
  curl_easy_reset(curl);
  Exchange ex;
  ex.curl = curl;
  ex.sink = sink;
  ex.response.url = request.url;

  char error_detail[CURL_ERROR_SIZE] = {0};  // libcurl's specific reason (TLS verification, ...)
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error_detail);
  curl_easy_setopt(curl, CURLOPT_URL, request.url.c_str());
  curl_easy_setopt(curl, CURLOPT_USERAGENT, "ktune/0.1");
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, 15L);
  if (!request.streaming) {
    curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1L);   // a stalled transfer (no byte for
    curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, 60L);   // 60 s) is a transport failure
  }
  const TlsOptions& tls = request.tls;
  curl_blob ca_blob{const_cast<char*>(tls.ca_pem.data()), tls.ca_pem.size(), CURL_BLOB_COPY};
  curl_blob cert_blob{const_cast<char*>(tls.client_cert_pem.data()), tls.client_cert_pem.size(), CURL_BLOB_COPY};
  curl_blob key_blob{const_cast<char*>(tls.client_key_pem.data()), tls.client_key_pem.size(), CURL_BLOB_COPY};
  if (!tls.ca_pem.empty()) curl_easy_setopt(curl, CURLOPT_CAINFO_BLOB, &ca_blob);
  else if (!tls.ca_file.empty()) curl_easy_setopt(curl, CURLOPT_CAINFO, tls.ca_file.c_str());
  if (!tls.client_cert_pem.empty()) {
    curl_easy_setopt(curl, CURLOPT_SSLCERT_BLOB, &cert_blob);
    curl_easy_setopt(curl, CURLOPT_SSLCERTTYPE, "PEM");
  } else if (!tls.client_cert_file.empty()) {
    curl_easy_setopt(curl, CURLOPT_SSLCERT, tls.client_cert_file.c_str());
  }
  if (!tls.client_key_pem.empty()) {
    curl_easy_setopt(curl, CURLOPT_SSLKEY_BLOB, &key_blob);
    curl_easy_setopt(curl, CURLOPT_SSLKEYTYPE, "PEM");
  } else if (!tls.client_key_file.empty()) {
    curl_easy_setopt(curl, CURLOPT_SSLKEY, tls.client_key_file.c_str());
  }
  if (tls.insecure_skip_verify) {
    curl_easy_setopt(curl, CURLOPT_SSL_VERIFYPEER, 0L);
    curl_easy_setopt(curl, CURLOPT_SSL_VERIFYHOST, 0L);
  }
  if (TransferInterrupt::active()) {
    curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(curl, CURLOPT_XFERINFODATA, &ex);
  }
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &ex);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &ex);
  // The body must arrive exactly as stored: no transparent decompression of gzip'd files.
  curl_easy_setopt(curl, CURLOPT_HTTP_CONTENT_DECODING, 0L);

  std::unique_ptr<FILE, int (*)(FILE*)> upload(nullptr, &std::fclose);
  const std::string& m = request.method;
  if (m == "HEAD") {
    curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
  } else if (!request.upload_path.empty()) {
    upload.reset(std::fopen(request.upload_path.c_str(), "rb"));
    if (!upload) throw Error(request.upload_path, "cannot open the file to upload");
    std::fseek(upload.get(), 0, SEEK_END);
    uint64_t size = uint64_t(std::ftell(upload.get()));
    uint64_t offset = std::min(request.upload_offset, size);
    ex.upload_left = std::min(request.upload_length, size - offset);
    std::fseek(upload.get(), long(offset), SEEK_SET);
    ex.upload = upload.get();
    curl_easy_setopt(curl, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(curl, CURLOPT_READFUNCTION, on_read);
    curl_easy_setopt(curl, CURLOPT_READDATA, &ex);
    curl_easy_setopt(curl, CURLOPT_INFILESIZE_LARGE, curl_off_t(ex.upload_left));
    if (m != "PUT") curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, m.c_str());
  } else if (m != "GET") {
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, curl_off_t(request.body.size()));
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, request.body.c_str());
    if (m != "POST") curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, m.c_str());
  }

  struct curl_slist* list = nullptr;
  bool has_content_type = false;
  for (const auto& [name, value] : request.headers) {
    std::string line = name + ": " + value;
    list = curl_slist_append(list, line.c_str());
    if (lower(name) == "content-type") has_content_type = true;
  }
  list = curl_slist_append(list, "Expect:");  // no 100-continue round trip
  if (!has_content_type && m != "GET" && m != "HEAD") list = curl_slist_append(list, "Content-Type:");
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, list);

  CURLcode code = curl_easy_perform(curl);
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, nullptr);  // the buffer lives on this frame only
  curl_slist_free_all(list);
  if (ex.sink_error) std::rethrow_exception(ex.sink_error);
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &ex.response.status);
  if (code != CURLE_OK) {
    // A truncated body of an error page is still an answer: keep the status for the caller.
    if (ex.response.status >= 400 && !ex.to_sink && code == CURLE_PARTIAL_FILE) return ex.response;
    std::string what = curl_easy_strerror(code);
    if (error_detail[0] != '\0' && what != error_detail) what += std::string(" (") + error_detail + ")";
    throw TransportError(request.method + " " + request.url, what, retryable_curl_code(code));
  }
  if (!ex.started && sink != nullptr && ex.response.status >= 200 && ex.response.status < 300 && m != "HEAD") {
    sink->begin(ex.response);  // an empty body: the sink still learns the response began
  }
  return ex.response;
}

HttpResponse HttpClient::perform(const HttpRequest& request, BodySink* sink) {
  HttpRequest current = request;
  std::map<std::string, std::string> first_headers;
  const std::string origin = url_origin(request.url);
  for (int hop = 0;; ++hop) {
    HttpResponse r = perform_once(current, sink);
    if (hop == 0) first_headers = r.headers;
    r.first_headers = first_headers;
    bool redirect = r.status == 301 || r.status == 302 || r.status == 303 || r.status == 307 || r.status == 308;
    if (!redirect || !request.follow_redirects || r.headers.count("location") == 0) return r;
    if (hop >= kMaxRedirects) throw Error(request.url, "more than 10 redirects");
    std::string next = resolve_url(current.url, r.headers["location"]);
    if (url_origin(next) != origin) {
      // Leaving the original host: the credentials stay behind.
      Headers kept;
      for (const auto& h : current.headers)
        if (lower(h.first) != "authorization") kept.push_back(h);
      current.headers = std::move(kept);
    }
    if (r.status == 303 || ((r.status == 301 || r.status == 302) && current.method == "POST")) {
      current.method = "GET";
      current.body.clear();
    }
    current.url = next;
  }
}

bool is_retryable_status(long status) {
  return status == 408 || status == 429 || status == 500 || status == 502 || status == 503 || status == 504;
}

static double parse_retry_after(const std::string& value) {
  if (value.empty()) return -1;
  bool digits = std::all_of(value.begin(), value.end(), [](unsigned char c) { return std::isdigit(c) || c == '.'; });
  if (digits) return std::atof(value.c_str());
  std::tm tm{};
  if (strptime(value.c_str(), "%a, %d %b %Y %H:%M:%S", &tm) == nullptr) return -1;
  double when = double(timegm(&tm));
  return std::max(0.0, when - double(std::time(nullptr)));
}

double retry_delay_seconds(const RetryPolicy& policy, int failed_attempts, const HttpResponse* response) {
  if (response != nullptr) {
    double after = parse_retry_after(response->header("retry-after"));
    if (after >= 0) return std::min(after, policy.max_retry_after_s);
  }
  double d = policy.base_delay_s * std::pow(2.0, std::max(0, failed_attempts - 1));
  return std::min(d, policy.max_delay_s);
}

namespace {
thread_local TransferInterrupt* current_interrupt = nullptr;
}  // namespace

TransferInterrupt::TransferInterrupt(std::function<void()> check) : check_(std::move(check)), outer_(current_interrupt) {
  current_interrupt = this;
}

TransferInterrupt::~TransferInterrupt() { current_interrupt = outer_; }

void TransferInterrupt::check() {
  if (current_interrupt != nullptr && current_interrupt->check_) current_interrupt->check_();
}

bool TransferInterrupt::active() { return current_interrupt != nullptr && current_interrupt->check_; }

void sleep_seconds(double seconds) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point until =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(std::max(0.0, seconds)));
  for (;;) {
    TransferInterrupt::check();
    const Clock::duration left = until - Clock::now();
    if (left <= Clock::duration::zero()) return;
    std::this_thread::sleep_for(std::min<Clock::duration>(left, std::chrono::milliseconds(100)));
  }
}

HttpResponse perform_with_retries(HttpClient& client, const std::function<HttpRequest()>& make_request,
                                  const RetryPolicy& policy, const std::string& what) {
  for (int attempt = 1;; ++attempt) {
    try {
      HttpResponse r = client.perform(make_request());
      if (!is_retryable_status(r.status) || attempt >= policy.max_attempts) return r;
      double delay = retry_delay_seconds(policy, attempt, &r);
      log_warn(what + ": HTTP " + std::to_string(r.status) + "; retrying in " + std::to_string(delay).substr(0, 4) +
               " s (attempt " + std::to_string(attempt + 1) + "/" + std::to_string(policy.max_attempts) + ")");
      sleep_seconds(delay);
    } catch (const TransportError& e) {
      if (!e.retryable() || attempt >= policy.max_attempts)
        throw Error(what, std::string(e.what_only()) + " (after " + std::to_string(attempt) + " attempts)");
      log_warn(what + ": " + e.what_only() + "; retrying (attempt " + std::to_string(attempt + 1) + "/" +
               std::to_string(policy.max_attempts) + ")");
      sleep_seconds(retry_delay_seconds(policy, attempt, nullptr));
    }
  }
}

std::string url_encode(std::string_view s, bool keep_slash) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/')) {
      out.push_back(char(c));
    } else {
      out.push_back('%');
      out.push_back(hex[c >> 4]);
      out.push_back(hex[c & 15]);
    }
  }
  return out;
}

}  // namespace ktune::hub
