// Kubeflow Trainer's status endpoint (see trainer_status.h).
#include "train/trainer_status.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "core/rfc3339.h"
#include "hub/http_client.h"
#include "train/metric_logger.h"

namespace ktune {

namespace {

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

std::string read_token(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path, "cannot read the status token (KUBEFLOW_TRAINER_SERVER_TOKEN)");
  std::ostringstream text;
  text << in.rdbuf();
  std::string token = text.str();
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r' || token.back() == ' ')) token.pop_back();
  return token;
}

// The URL without its query (what a warning may show).
std::string shown_url(const std::string& url) { return url.substr(0, url.find('?')); }

}  // namespace

std::string trainer_status_body(const TrainerProgress& p, std::optional<double> remaining_seconds, int64_t now) {
  nlohmann::ordered_json status = nlohmann::ordered_json::object();
  if (p.total_steps > 0) {
    const int64_t percent = std::clamp<int64_t>(p.step * 100 / p.total_steps, 0, 100);
    status["progressPercentage"] = percent;
  }
  if (remaining_seconds && std::isfinite(*remaining_seconds))
    status["estimatedRemainingSeconds"] = std::max<int64_t>(0, int64_t(std::llround(*remaining_seconds)));
  nlohmann::ordered_json metrics = nlohmann::ordered_json::array();
  for (const auto& [name, value] : p.metrics)
    if (std::isfinite(value)) metrics.push_back({{"name", name}, {"value", format_metric(value)}});
  metrics.push_back({{"name", "currentStep"}, {"value", std::to_string(p.step)}});
  metrics.push_back({{"name", "totalSteps"}, {"value", std::to_string(p.total_steps)}});
  metrics.push_back({{"name", "currentEpoch"}, {"value", std::to_string(p.epoch + 1)}});
  metrics.push_back({{"name", "totalEpochs"}, {"value", std::to_string(p.total_epochs)}});
  status["metrics"] = std::move(metrics);
  status["lastUpdatedTime"] = format_rfc3339(now);
  return nlohmann::ordered_json{{"trainerStatus", std::move(status)}}.dump();
}

// KUBEFLOW_TRAINER_SERVER_<what> (upstream's SDK and controller), else the KEP's KUBEFLOW_TRAINER_STATUS_<what>.
static std::string trainer_env(const std::string& what) {
  const std::string server = env_or_empty(("KUBEFLOW_TRAINER_SERVER_" + what).c_str());
  return server.empty() ? env_or_empty(("KUBEFLOW_TRAINER_STATUS_" + what).c_str()) : server;
}

std::unique_ptr<TrainerStatusReporter> TrainerStatusReporter::from_env(int rank) {
  const std::string url = trainer_env("URL");
  if (url.empty() || rank != 0) return nullptr;
  double interval = 15;
  if (const std::string text = env_or_empty("KTUNE_TRAINER_STATUS_INTERVAL_SECONDS"); !text.empty()) {
    char* end = nullptr;
    interval = std::strtod(text.c_str(), &end);
    if (end == text.c_str() || *end != 0 || !(interval >= 0))
      throw Error("KTUNE_TRAINER_STATUS_INTERVAL_SECONDS", "expects a number of seconds >= 0, got '" + text + "'");
  }
  return std::make_unique<TrainerStatusReporter>(
      TrainerStatusEndpoint{url, trainer_env("CA_CERT"), trainer_env("TOKEN")},
      interval);
}

// What the recipe's thread and the worker share; the worker holds it too, so a send still in
// flight after finish() gave up waiting touches nothing freed.
struct TrainerStatusReporter::Shared {
  TrainerStatusEndpoint endpoint;
  std::chrono::duration<double> interval;
  std::mutex mutex;
  std::condition_variable wake;
  TrainerProgress latest;
  std::optional<std::chrono::steady_clock::time_point> first_time;  // the first report of this run
  int64_t first_step = 0;
  std::optional<std::string> pending;  // a body not yet sent
  bool urgent = false;                 // send it without waiting for the interval
  bool sending = false;
  bool stopping = false;
  bool gave_up = false;
  int failures_in_a_row = 0;
  int64_t sent = 0;
};

namespace {

// One POST; "" when the endpoint took it, else why not, and whether to try no more.
std::string post_status(const TrainerStatusEndpoint& endpoint, const std::string& body, bool* refused) {
  *refused = false;
  try {
    hub::HttpRequest request;
    request.method = "POST";
    request.url = endpoint.url;
    request.body = body;
    request.follow_redirects = false;
    request.headers.push_back({"Content-Type", "application/json"});
    if (!endpoint.token_file.empty())
      request.headers.push_back({"Authorization", "Bearer " + read_token(endpoint.token_file)});
    request.tls.ca_file = endpoint.ca_file;
    hub::HttpClient client;
    const hub::HttpResponse response = client.perform(request);
    if (response.status >= 200 && response.status < 300) return "";
    *refused = response.status >= 400 && response.status < 500 && !hub::is_retryable_status(response.status);
    std::string answer = response.body.substr(0, 300);
    while (!answer.empty() && (answer.back() == '\n' || answer.back() == '\r')) answer.pop_back();
    return "HTTP " + std::to_string(response.status) + (answer.empty() ? "" : ": " + answer);
  } catch (const Error& e) {
    return e.what();
  }
}

}  // namespace

TrainerStatusReporter::TrainerStatusReporter(TrainerStatusEndpoint endpoint, double min_interval_seconds)
    : shared_(std::make_shared<Shared>()) {
  shared_->endpoint = std::move(endpoint);
  shared_->interval = std::chrono::duration<double>(min_interval_seconds);
  worker_ = std::thread(&TrainerStatusReporter::run, shared_);
}

TrainerStatusReporter::~TrainerStatusReporter() { finish(); }

void TrainerStatusReporter::report(int64_t step, int64_t total_steps, int64_t epoch, int64_t total_epochs,
                                   const std::vector<std::pair<std::string, double>>& metrics) {
  Shared& s = *shared_;
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.gave_up || s.stopping) return;
  if (!s.first_time) s.first_time = now, s.first_step = step;
  s.latest.step = step, s.latest.total_steps = total_steps, s.latest.epoch = epoch, s.latest.total_epochs = total_epochs;
  for (const auto& [name, value] : metrics) {
    bool replaced = false;
    for (auto& kept : s.latest.metrics)
      if (kept.first == name) kept.second = value, replaced = true;
    if (!replaced) s.latest.metrics.emplace_back(name, value);
  }
  // The remaining time at this run's own pace (a resumed run's earlier steps took other time).
  std::optional<double> remaining;
  const double elapsed = std::chrono::duration<double>(now - *s.first_time).count();
  if (step >= total_steps) remaining = 0.0;
  else if (step > s.first_step && elapsed > 0) remaining = elapsed / double(step - s.first_step) * double(total_steps - step);
  s.pending = trainer_status_body(s.latest, remaining, int64_t(std::time(nullptr)));
  if (s.sent == 0 && s.failures_in_a_row == 0) s.urgent = true;
  if (step >= total_steps) s.urgent = true;
  s.wake.notify_all();
}

void TrainerStatusReporter::finish(double wait_seconds) {
  if (!worker_.joinable()) return;
  Shared& s = *shared_;
  std::unique_lock<std::mutex> lock(s.mutex);
  s.stopping = true;
  s.wake.notify_all();
  const bool done = s.wake.wait_for(lock, std::chrono::duration<double>(wait_seconds),
                                    [&] { return !s.sending && (!s.pending || s.gave_up); });
  if (!done)
    log_warn("trainer status: the last status did not reach " + shown_url(s.endpoint.url) + " within " +
             std::to_string(int(wait_seconds)) + " s");
  lock.unlock();
  if (done) worker_.join();
  else worker_.detach();  // it holds `shared_`, nothing of this object
}

int64_t TrainerStatusReporter::sent() const {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  return shared_->sent;
}

void TrainerStatusReporter::run(std::shared_ptr<Shared> shared) {
  Shared& s = *shared;
  std::optional<std::chrono::steady_clock::time_point> last_send;
  std::unique_lock<std::mutex> lock(s.mutex);
  for (;;) {
    auto due = [&] {
      return last_send ? *last_send + std::chrono::duration_cast<std::chrono::steady_clock::duration>(s.interval)
                       : std::chrono::steady_clock::now();
    };
    auto ready = [&] {
      return s.pending && !s.gave_up && (s.urgent || s.stopping || std::chrono::steady_clock::now() >= due());
    };
    while (!ready() && !(s.stopping && (!s.pending || s.gave_up))) {
      if (s.pending && !s.gave_up) s.wake.wait_until(lock, due());
      else s.wake.wait(lock);
    }
    if (!ready()) {  // stopping with nothing (more) to send
      s.wake.notify_all();
      return;
    }
    const std::string body = std::move(*s.pending);
    s.pending.reset();
    s.urgent = false;
    s.sending = true;
    lock.unlock();
    bool refused = false;
    const std::string failure = post_status(s.endpoint, body, &refused);
    lock.lock();
    s.sending = false;
    last_send = std::chrono::steady_clock::now();
    if (failure.empty()) {
      ++s.sent;
      s.failures_in_a_row = 0;
    } else {
      const bool first = s.failures_in_a_row++ == 0;
      if (refused || s.failures_in_a_row >= kMaxFailuresInARow) {
        s.gave_up = true;
        log_warn("trainer status: " + shown_url(s.endpoint.url) + " did not take the run's status (" + failure +
                 "); training goes on without reporting it");
      } else if (first) {
        log_warn("trainer status: " + shown_url(s.endpoint.url) + " did not take the run's status (" + failure +
                 "); trying again with the next one");
      }
      if (s.stopping && !s.gave_up && !s.pending) s.pending = body;  // the last status: once more, while finish() waits
    }
    s.wake.notify_all();
  }
}

}  // namespace ktune
