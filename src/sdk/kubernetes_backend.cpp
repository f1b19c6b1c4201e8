// The Kubernetes backend over the API server's REST interface (see kubernetes_backend.h).
#include "sdk/kubernetes_backend.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <cstdlib>
#include <ctime>
#include <regex>
#include <set>
#include <thread>

#include "core/log.h"
#include "core/rfc3339.h"
#include "runtime/runtime_catalog.h"
#include "sdk/kube_objects.h"
#include "sdk/local_backend.h"

namespace ktune::sdk {

using Json = v1alpha1::Json;

namespace {

constexpr const char* kJobSetNameLabel = "jobset.sigs.k8s.io/jobset-name";
constexpr const char* kReplicatedJobLabel = "jobset.sigs.k8s.io/replicatedjob-name";
constexpr const char* kJobIndexLabel = "batch.kubernetes.io/job-completion-index";

// Pod phase → ktune's step status.
std::string step_status_of_phase(const std::string& phase) {
  if (phase == "Pending" || phase.empty()) return kCreated;
  if (phase == "Running") return kRunning;
  if (phase == "Succeeded") return kComplete;
  if (phase == "Failed") return kFailed;
  return phase;  // "Unknown": shown as the cluster says it
}

int role_order(const std::string& role) {
  if (role == "dataset-initializer") return 0;
  if (role == "model-initializer") return 1;
  if (role == "launcher") return 2;
  return 3;
}

v1alpha1::ResourceRequirements resources_of(const Json& container) {
  v1alpha1::ResourceRequirements r;
  const Json& res = json_field(container, "resources");
  for (const char* field : {"limits", "requests"}) {
    const Json& m = json_field(res, field);
    if (!m.is_object()) continue;
    for (const auto& [k, v] : m.items())
      (std::string(field) == "limits" ? r.limits : r.requests)[k] = v.is_string() ? v.get<std::string>() : v.dump();
  }
  return r;
}

// Reads a streamed body line by line into a LogLineSink; stops the transfer when the sink says so.
// With a ResumePoint (a followed log asked with timestamps=true), each line starts with its
// RFC 3339 time: the time is cut off before the sink sees the line, and lines at or before the
// point already delivered are skipped, so a stream reopened from sinceTime (whole seconds, earlier
// than the last line) neither repeats nor loses a line.
struct StopReading {};
class LineSink : public hub::BodySink {
 public:
  LineSink(const LogLineSink& sink, LogResumePoint* resume) : sink_(sink), resume_(resume) {
    if (resume_) replay_equal_ = resume_->lines_at_time;
  }
  void begin(const hub::HttpResponse&) override {}
  void write(const char* data, size_t size) override {
    pending_.append(data, size);
    size_t start = 0;
    for (size_t nl; (nl = pending_.find('\n', start)) != std::string::npos; start = nl + 1) {
      std::string line = pending_.substr(start, nl - start);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      deliver(line);
    }
    pending_.erase(0, start);
  }
  // The stream ended properly: a last line without '\n' is still a line.
  void finish() {
    if (!pending_.empty()) deliver(pending_);
    pending_.clear();
  }
  // The stream was cut: a partial last line is dropped (the reopened stream sends it whole).
  void discard_partial() { pending_.clear(); }
  size_t delivered() const { return delivered_; }

 private:
  void deliver(std::string line) {
    if (resume_) {
      const size_t space = line.find(' ');
      const int64_t t = space == std::string::npos ? -1 : parse_rfc3339_ns(line.substr(0, space));
      if (t >= 0) {
        line.erase(0, space + 1);
        if (resume_->time_ns >= 0 && t < resume_->time_ns) return;  // delivered before the stream was reopened
        if (t == resume_->time_ns) {
          if (replay_equal_ > 0) {
            --replay_equal_;
            return;
          }
          ++resume_->lines_at_time;
        } else {
          resume_->time_ns = t;
          resume_->lines_at_time = 1;
          replay_equal_ = 0;
        }
      }
    }
    ++delivered_;
    if (!sink_(line)) {
      pending_.clear();
      throw StopReading{};
    }
  }

  const LogLineSink& sink_;
  LogResumePoint* resume_;
  size_t replay_equal_ = 0;  // lines at resume_->time_ns the reopened stream repeats
  size_t delivered_ = 0;
  std::string pending_;
};

// A transport failure said plainly: which server, which credentials, and for TLS what to check.
Error transport_error(const std::string& where, const KubeConnection& c, const std::string& detail) {
  std::string hint;
  if (detail.find("SSL peer certificate") != std::string::npos || detail.find("SSL certificate problem") != std::string::npos ||
      detail.find("certificate verify failed") != std::string::npos)
    hint = "; the server's TLS certificate does not verify against the CA this kubeconfig gives (the cluster's "
           "certificate-authority-data or certificate-authority; the system's CAs when it gives none): fix the CA, "
           "or for a throwaway cluster only set insecure-skip-tls-verify: true";
  else if (detail.find("alert certificate required") != std::string::npos ||
           detail.find("alert bad certificate") != std::string::npos ||
           detail.find("alert unknown ca") != std::string::npos ||
           detail.find("alert certificate unknown") != std::string::npos)
    hint = "; the server refused the TLS client certificate (client-certificate-data / client-key-data) of this "
           "kubeconfig user, or wants one and none was given";
  else if (c.server.rfind("https://", 0) == 0 && (detail.find("Failed sending data to the peer") != std::string::npos ||
                                                   detail.find("Failure when receiving data from the peer") != std::string::npos ||
                                                   detail.find("SSL connect error") != std::string::npos))
    hint = "; the server closed the TLS connection (if it requires a client certificate, check this kubeconfig user's "
           "client-certificate and client-key)";
  else if (detail.find("unable to set private key") != std::string::npos ||
           detail.find("could not load PEM client certificate") != std::string::npos ||
           detail.find("unable to use client certificate") != std::string::npos)
    hint = "; the client certificate or key of this kubeconfig user cannot be used";
  return Error(where, "cannot reach the API server " + c.server + " (" + c.source + "): " + detail + hint);
}

std::string api_message(const hub::HttpResponse& r) {
  std::string reason, message;
  try {
    const Json status = Json::parse(r.body);
    reason = json_text(status, "reason");
    message = json_text(status, "message");
  } catch (...) {
    message = r.body.substr(0, 500);
    while (!message.empty() && (message.back() == '\n' || message.back() == ' ')) message.pop_back();
  }
  std::string out = std::to_string(r.status) + (reason.empty() ? "" : " " + reason);
  if (!message.empty()) out += ": " + message;
  return redact(out);
}

}  // namespace

KubernetesBackend::KubernetesBackend(const BackendConfig& config)
    : KubernetesBackend(load_kube_connection(config.kubeconfig, config.kubernetes_context), config.kubernetes_namespace) {}

KubernetesBackend::KubernetesBackend(KubeConnection connection, std::string kubernetes_namespace)
    : connection_(std::move(connection)), namespace_(std::move(kubernetes_namespace)) {
  if (namespace_.empty()) namespace_ = connection_.namespace_.empty() ? "default" : connection_.namespace_;
  register_secret(connection_.bearer_token);
}

std::string KubernetesBackend::trainjobs_path() const {
  return "/apis/trainer.kubeflow.org/v1alpha1/namespaces/" + hub::url_encode(namespace_, false) + "/trainjobs";
}

Json KubernetesBackend::request(const std::string& method, const std::string& path, const std::string& body,
                                const std::string& content_type) {
  auto make = [&] {
    hub::HttpRequest r;
    r.method = method;
    r.url = connection_.server + path;
    r.tls = connection_.tls;
    r.headers.emplace_back("Accept", "application/json");
    if (!connection_.bearer_token.empty()) r.headers.emplace_back("Authorization", "Bearer " + connection_.bearer_token);
    if (method != "GET" && method != "DELETE") {
      r.headers.emplace_back("Content-Type", content_type);
      r.body = body;
    }
    return r;
  };
  const std::string where = "kubernetes " + method + " " + path;
  hub::HttpResponse response;
  try {
    if (method == "GET") {
      hub::RetryPolicy policy;
      policy.max_attempts = 3;
      response = hub::perform_with_retries(http_, make, policy, where);
    } else {
      response = http_.perform(make());
    }
  } catch (const Error& e) {  // transport failures (after the retries of a GET)
    throw transport_error(where, connection_, e.what());
  }
  if (response.status < 200 || response.status >= 300) throw KubernetesApiError(where, api_message(response), response.status);
  if (response.body.empty()) return Json::object();
  try {
    return Json::parse(response.body);
  } catch (const std::exception& e) {
    throw Error(where, std::string("the API server answered with malformed JSON: ") + e.what());
  }
}

const v1alpha1::TrainingRuntime* KubernetesBackend::runtime_of(const std::string& kind, const std::string& name) {
  const std::string key = kind + "/" + name;
  auto it = runtimes_.find(key);
  if (it != runtimes_.end()) return it->second.get();
  std::unique_ptr<v1alpha1::TrainingRuntime> runtime;
  const std::string path = kind == v1alpha1::kTrainingRuntimeKind
                               ? "/apis/trainer.kubeflow.org/v1alpha1/namespaces/" + hub::url_encode(namespace_, false) +
                                     "/trainingruntimes/" + hub::url_encode(name, false)
                               : "/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes/" + hub::url_encode(name, false);
  try {
    runtime = std::make_unique<v1alpha1::TrainingRuntime>(v1alpha1::runtime_from_json(request("GET", path), path));
  } catch (const Error& e) {
    // Not readable (no permission, deleted since): the job still shows, with the TrainJob's own fields.
    log_debug("runtime " + key + " is not readable: " + e.what());
  }
  return (runtimes_[key] = std::move(runtime)).get();
}

TrainJobRecord KubernetesBackend::record_of(const Json& trainjob) {
  TrainJobRecord r;
  const Json& meta = json_field(trainjob, "metadata");
  const Json& spec = json_field(trainjob, "spec");
  const Json& status = json_field(trainjob, "status");
  r.name = json_text(meta, "name");
  r.created_at = parse_rfc3339(json_text(meta, "creationTimestamp"));
  const Json& ref = json_field(spec, "runtimeRef");
  r.runtime = json_text(ref, "name");
  r.exports = exports_of(trainjob);
  const std::string ref_kind = json_text(ref, "kind").empty() ? v1alpha1::kClusterTrainingRuntimeKind : json_text(ref, "kind");
  const v1alpha1::TrainingRuntime* runtime = r.runtime.empty() ? nullptr : runtime_of(ref_kind, r.runtime);
  if (runtime) r.trainer_type = runtime->framework() == "torchtune" ? "BuiltinTrainer" : "CustomTrainer";
  const Json& trainer = json_field(spec, "trainer");
  if (json_field(trainer, "numNodes").is_number_integer()) r.num_nodes = json_field(trainer, "numNodes").get<int>();
  else if (runtime && runtime->ml_policy.num_nodes) r.num_nodes = *runtime->ml_policy.num_nodes;
  if (json_field(trainer, "numProcPerNode").is_number_integer()) r.num_proc_per_node = json_field(trainer, "numProcPerNode").get<int>();

  // Steps from the job's pods.
  const std::string selector = std::string(kJobSetNameLabel) + "=" + r.name + "," + kReplicatedJobLabel +
                               " in (dataset-initializer, model-initializer, launcher, node)";
  const Json pods = request("GET", "/api/v1/namespaces/" + hub::url_encode(namespace_, false) +
                                       "/pods?labelSelector=" + hub::url_encode(selector, false));
  std::vector<const Json*> items;
  if (json_field(pods, "items").is_array())
    for (const Json& p : pods["items"]) items.push_back(&p);
  std::stable_sort(items.begin(), items.end(), [](const Json* a, const Json* b) {
    return json_text(json_field(*a, "metadata"), "creationTimestamp") > json_text(json_field(*b, "metadata"), "creationTimestamp");
  });
  std::vector<std::pair<std::pair<int, int>, StepRecord>> steps;
  std::set<std::string> seen;
  int running_nodes = 0;
  // MPI runtimes (as upstream's SDK names their steps): the launcher is node-0, worker i node-(i+1),
  // and the launcher counts among the job's nodes.
  const bool mpi = runtime != nullptr && !runtime->ml_policy.mpi.is_null();
  for (const Json* pod : items) {
    const Json& labels = json_field(json_field(*pod, "metadata"), "labels");
    const std::string role = json_text(labels, kReplicatedJobLabel);
    if (role.empty()) continue;
    const bool is_node = role == "node" || role == "launcher";
    const std::string index = json_text(labels, kJobIndexLabel);
    int job_index = std::atoi(index.c_str());
    const std::string key = is_node ? role + "-" + index : role;
    if (!seen.insert(key).second) continue;
    StepRecord s;
    const int node = role == "launcher" ? 0 : job_index + (mpi ? 1 : 0);
    s.name = is_node ? "node-" + std::to_string(node) : role;
    s.pod_name = json_text(json_field(*pod, "metadata"), "name");
    const Json& pstatus = json_field(*pod, "status");
    s.pod_phase = json_text(pstatus, "phase");
    s.status = step_status_of_phase(s.pod_phase);
    s.started_at = parse_rfc3339(json_text(pstatus, "startTime"));
    s.node_rank = is_node ? node : -1;
    s.device = "Unknown";
    s.device_count = "Unknown";
    const std::string container_name = is_node ? "node" : role;
    const Json& containers = json_field(json_field(*pod, "spec"), "containers");
    if (containers.is_array())
      for (const Json& c : containers) {
        if (json_text(c, "name") != container_name) continue;
        std::string device, count;
        if (container_devices(resources_of(c), &device, &count)) {
          s.device = device;
          s.device_count = count;
        }
        if (json_field(c, "env").is_array())
          for (const Json& e : c["env"])
            if (is_node && json_text(e, "name") == "PET_NPROC_PER_NODE") {
              const std::string v = json_text(e, "value");
              if (!v.empty() && std::all_of(v.begin(), v.end(), ::isdigit)) s.device_count = v;
            }
        if (json_field(c, "command").is_array())
          for (const Json& a : c["command"]) s.command.push_back(a.is_string() ? a.get<std::string>() : a.dump());
        if (json_field(c, "args").is_array())
          for (const Json& a : c["args"]) s.command.push_back(a.is_string() ? a.get<std::string>() : a.dump());
      }
    if (json_field(pstatus, "containerStatuses").is_array())
      for (const Json& cs : pstatus["containerStatuses"]) {
        if (json_text(cs, "name") != container_name) continue;
        const Json& term = json_field(json_field(cs, "state"), "terminated");
        if (term.is_object()) {
          if (json_field(term, "exitCode").is_number_integer()) s.exit_code = term["exitCode"].get<int>();
          s.finished_at = parse_rfc3339(json_text(term, "finishedAt"));
        }
      }
    if (is_node && (role == "node" || mpi) && (s.status == kRunning || s.status == kComplete)) ++running_nodes;
    steps.push_back({{role_order(role), node}, s});
  }
  std::sort(steps.begin(), steps.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [order, s] : steps) {
    s.index = int(r.steps.size());
    if (r.started_at == 0 || (s.started_at > 0 && s.started_at < r.started_at)) r.started_at = s.started_at;
    r.steps.push_back(std::move(s));
  }

  // Status: a terminal condition, else Running when every node runs (or ran), else Created.
  r.status = kCreated;
  bool terminal = false;
  if (json_field(status, "conditions").is_array())
    for (const Json& c : status["conditions"]) {
      const std::string type = json_text(c, "type");
      if ((type == kComplete || type == kFailed) && json_text(c, "status") == "True") {
        r.status = type;
        terminal = true;
        r.finished_at = parse_rfc3339(json_text(c, "lastTransitionTime"));
        if (type == kFailed) {
          const std::string reason = json_text(c, "reason"), message = json_text(c, "message");
          r.reason = reason + (reason.empty() || message.empty() ? "" : ": ") + message;
        }
      }
    }
  if (!terminal && r.num_nodes > 0 && running_nodes == r.num_nodes) r.status = kRunning;

  // Progress (trainerStatus), when the trainer reports it.
  const Json& ts = json_field(status, "trainerStatus");
  if (ts.is_object()) {
    r.progress.present = true;
    if (json_field(ts, "progressPercentage").is_number()) r.progress.progress_percentage = ts["progressPercentage"].get<double>();
    if (json_field(ts, "estimatedRemainingSeconds").is_number())
      r.progress.estimated_remaining_seconds = ts["estimatedRemainingSeconds"].get<double>();
    if (json_field(ts, "metrics").is_array())
      for (const Json& m : ts["metrics"]) {
        const std::string value = json_text(m, "value");
        char* end = nullptr;
        const double v = std::strtod(value.c_str(), &end);
        if (!json_text(m, "name").empty() && end != value.c_str()) r.progress.metrics[json_text(m, "name")] = v;
      }
  }
  return r;
}

Json KubernetesBackend::trainjob_object(const TrainJobPlan& plan) const {
  if (plan.trainjob_json.empty())
    throw Error("kubernetes backend", "the plan of " + plan.job_name + " carries no TrainJob (plans from build_plan do)");
  Json job = Json::parse(plan.trainjob_json);
  if (json_text(json_field(job, "metadata"), "name").empty()) throw Error("kubernetes backend", "the plan's TrainJob has no metadata.name");
  job["metadata"]["namespace"] = namespace_;
  return job;
}

// The job's Secret is made before the job, so a name already taken is first met as a Secret that
// exists (409): it names the TrainJob that holds the name when there is one, else the Secret left
// without its job.
void KubernetesBackend::refuse_taken_name(const std::string& name, const std::string& secret_name,
                                          const KubernetesApiError& conflict) {
  try {
    request("GET", trainjobs_path() + "/" + hub::url_encode(name, false));
  } catch (const KubernetesApiError& e) {
    if (e.status() == 404)
      throw KubernetesApiError(conflict.where(), conflict.what_only() + " (no TrainJob " + name +
                                                     " owns it: kubectl delete secret " + secret_name + " -n " +
                                                     namespace_ + " frees the name)",
                               409);
    throw conflict;
  }
  throw KubernetesApiError("TrainJob " + namespace_ + "/" + name,
                           "409 AlreadyExists: a TrainJob with this name already exists (ktune jobs delete " + name +
                               " frees the name)",
                           409);
}

std::string KubernetesBackend::submit(const TrainJobPlan& plan) {
  const Json job = trainjob_object(plan);
  const std::string name = json_text(json_field(job, "metadata"), "name");
  const std::string secrets_path = "/api/v1/namespaces/" + hub::url_encode(namespace_, false) + "/secrets";
  if (!plan.secret_data.empty()) {
    const Json secret = credentials_secret(plan.secret_name, namespace_, name, plan.secret_data);
    try {
      request("POST", secrets_path, secret.dump());
    } catch (const KubernetesApiError& e) {
      if (e.status() != 409) throw;
      refuse_taken_name(name, plan.secret_name, e);
    }
  }
  Json created;
  try {
    created = request("POST", trainjobs_path(), job.dump());
  } catch (...) {
    if (!plan.secret_data.empty()) {
      try {
        request("DELETE", secrets_path + "/" + hub::url_encode(plan.secret_name, false));
      } catch (const Error& e) {
        log_warn("could not delete the Secret " + plan.secret_name + " of the TrainJob that was not created: " + e.what());
      }
    }
    throw;
  }
  const std::string uid = json_text(json_field(created, "metadata"), "uid");
  if (!plan.secret_data.empty() && !uid.empty()) {
    // The Secret now belongs to the TrainJob: the cluster's garbage collector deletes it with the job.
    const Json patch = {{"metadata",
                         {{"ownerReferences",
                           Json::array({{{"apiVersion", "trainer.kubeflow.org/v1alpha1"},
                                         {"kind", "TrainJob"},
                                         {"name", name},
                                         {"uid", uid}}})}}}};
    try {
      request("PATCH", secrets_path + "/" + hub::url_encode(plan.secret_name, false), patch.dump(),
              "application/merge-patch+json");
    } catch (const Error& e) {
      log_warn("the Secret " + plan.secret_name + " is not owned by TrainJob " + name +
               " (delete it with the job: ktune jobs delete): " + e.what());
    }
  }
  return name;
}

std::vector<TrainJobRecord> KubernetesBackend::list_jobs(const std::string& runtime) {
  const Json list = request("GET", trainjobs_path());
  std::vector<TrainJobRecord> out;
  if (!json_field(list, "items").is_array()) return out;
  for (const Json& item : list["items"]) {
    if (!runtime.empty() && json_text(json_field(json_field(item, "spec"), "runtimeRef"), "name") != runtime) continue;
    out.push_back(record_of(item));
  }
  std::sort(out.begin(), out.end(), [](const TrainJobRecord& a, const TrainJobRecord& b) {
    return a.created_at != b.created_at ? a.created_at > b.created_at : a.name < b.name;
  });
  return out;
}

std::vector<types::Event> KubernetesBackend::get_job_events(const std::string& name) {
  const TrainJobRecord job = get_job(name);  // a job that is not there is named as get_job names it
  std::set<std::string> pods;
  for (const StepRecord& s : job.steps)
    if (!s.pod_name.empty()) pods.insert(s.pod_name);
  const Json list = request("GET", "/api/v1/namespaces/" + hub::url_encode(namespace_, false) + "/events");
  std::vector<types::Event> events;
  for (const Json& e : list.value("items", Json::array())) {
    if (!e.is_object() || !e.contains("involvedObject") || !e["involvedObject"].is_object()) continue;
    const Json& object = e["involvedObject"];
    const std::string kind = json_text(object, "kind"), object_name = json_text(object, "name");
    const std::string first = json_text(e, "firstTimestamp");
    if (first.empty()) continue;
    const bool part_of_job = object_name == name || pods.count(object_name) ||
                             (kind != "TrainJob" && object_name.rfind(name + "-", 0) == 0);
    if (!part_of_job || (kind != "TrainJob" && kind != "JobSet" && kind != "Job" && kind != "Pod")) continue;
    events.push_back({kind, object_name, json_text(e, "message"), json_text(e, "reason"), first});
  }
  std::stable_sort(events.begin(), events.end(), [](const types::Event& a, const types::Event& b) {
    return parse_rfc3339(a.event_time) < parse_rfc3339(b.event_time);
  });
  return events;
}

TrainJobRecord KubernetesBackend::get_job(const std::string& name) {
  try {
    return record_of(request("GET", trainjobs_path() + "/" + hub::url_encode(name, false)));
  } catch (const KubernetesApiError& e) {
    if (e.status() == 404)
      throw KubernetesApiError("TrainJob " + namespace_ + "/" + name, std::string("not found: ") + e.what(), 404);
    throw;
  }
}

std::string KubernetesBackend::container_state(const std::string& pod, const std::string& container) {
  Json p;
  try {
    p = request("GET", "/api/v1/namespaces/" + hub::url_encode(namespace_, false) + "/pods/" + hub::url_encode(pod, false));
  } catch (const KubernetesApiError& e) {
    if (e.status() == 404) return "gone";
    throw;
  }
  const Json& status = json_field(p, "status");
  if (json_field(status, "containerStatuses").is_array())
    for (const Json& cs : status["containerStatuses"]) {
      if (json_text(cs, "name") != container) continue;
      const Json& state = json_field(cs, "state");
      if (json_field(state, "terminated").is_object()) return "terminated";
      if (json_field(state, "running").is_object()) return "running";
      return "waiting";
    }
  const std::string phase = json_text(status, "phase");
  return phase == "Succeeded" || phase == "Failed" ? "terminated" : "running";
}

// The pod that runs `step` now, other than `previous` (one that is gone): "" when there is none and,
// without follow or once the job has ended, none will come. While following, waits for one past Pending.
std::string KubernetesBackend::step_pod(const std::string& name, const std::string& step, bool follow,
                                        const std::string& previous) {
  while (true) {
    const TrainJobRecord job = get_job(name);
    const StepRecord* s = job.step(step);
    if (s && !s->pod_name.empty() && s->pod_name != previous && s->status != kCreated) return s->pod_name;
    if (!follow || is_terminal(job.status)) return "";  // as upstream: no pod past Pending, no lines
    std::this_thread::sleep_for(std::chrono::duration<double>(poll_interval_));
  }
}

void KubernetesBackend::get_job_logs(const std::string& name, const std::string& step, bool follow,
                                     const LogLineSink& sink) {
  static const std::regex index_suffix("-[0-9]+$");
  const std::string container = std::regex_replace(step, index_suffix, "");
  // A step's pod may go away while its log is followed (evicted, its node lost) and JobSet start a
  // new one: the log goes on with the replacement's, from its start, and says so.
  std::string previous;
  try {
    while (true) {
      const std::string pod = step_pod(name, step, follow, previous);
      if (pod.empty()) {
        if (!previous.empty())
          log_warn("the pod " + previous + " of " + name + "/" + step + " is gone and no other pod runs the step: " +
                   "its log ends here, possibly before its end");
        return;
      }
      if (!previous.empty())
        log_warn("the pod " + previous + " of " + name + "/" + step + " is gone; following its replacement " + pod +
                 " from its start");
      if (!read_pod_log(pod, container, follow, sink)) return;
      previous = pod;
    }
  } catch (const StopReading&) {
    return;
  }
}

// Reads one pod's log of `container` into sink, following it while the container runs. Returns true
// when the pod went away before its container ended (a follow cut short), false when the log was read.
bool KubernetesBackend::read_pod_log(const std::string& pod, const std::string& container, bool follow,
                                     const LogLineSink& sink) {
  const std::string base = connection_.server + "/api/v1/namespaces/" + hub::url_encode(namespace_, false) + "/pods/" +
                           hub::url_encode(pod, false) + "/log?container=" + hub::url_encode(container, false);
  const std::string where = "kubernetes GET pods/" + pod + "/log";

  // One GET of the log. Returns false when the stream was cut (a transport failure), with why.
  LogResumePoint resume;
  auto read = [&](bool follow_now, std::string* cut) -> bool {
    hub::HttpRequest r;
    r.url = base;
    if (follow) {  // timestamps let a reopened stream start where this one stopped
      r.url += "&timestamps=true";
      if (resume.time_ns >= 0) r.url += "&sinceTime=" + hub::url_encode(format_rfc3339(resume.time_ns / 1000000000), false);
    }
    if (follow_now) r.url += "&follow=true";
    r.tls = connection_.tls;
    r.streaming = follow_now;
    if (!connection_.bearer_token.empty()) r.headers.emplace_back("Authorization", "Bearer " + connection_.bearer_token);
    LineSink lines(sink, follow ? &resume : nullptr);
    hub::HttpResponse response;
    try {
      response = http_.perform(r, &lines);
    } catch (const hub::TransportError& e) {
      lines.discard_partial();
      if (!follow_now) throw transport_error(where, connection_, e.what());
      *cut = e.what();
      return false;
    }
    if (response.status < 200 || response.status >= 300) throw KubernetesApiError(where, api_message(response), response.status);
    lines.finish();
    return true;
  };

  if (!follow) {
    std::string cut;
    read(false, &cut);
    return false;
  }
  // Follow until the container has ended. The API server may end a stream early (a timeout, a
  // restarted kubelet or apiserver) or the connection may drop: while the container still runs,
  // the stream is reopened from the last line's time.
  constexpr int kMaxFruitlessReopens = 5;
  int fruitless = 0;
  while (true) {
    const int64_t before_time = resume.time_ns;
    const size_t before_count = resume.lines_at_time;
    std::string cut;
    bool clean = false;
    try {
      clean = read(true, &cut);
    } catch (const KubernetesApiError& e) {
      if (e.status() == 404) return true;  // the pod was deleted between two reads of its log
      throw;
    }
    const bool progress = resume.time_ns != before_time || resume.lines_at_time != before_count;
    fruitless = progress ? 0 : fruitless + 1;
    const std::string state = container_state(pod, container);
    if (state == "gone") return true;
    if (state == "terminated") {
      // Its log is complete now. A stream cut (or ended early by the server) just before the
      // container's last lines would miss them: read the rest once, without follow (the lines
      // already delivered are skipped).
      read(false, &cut);
      return false;
    }
    if (fruitless >= kMaxFruitlessReopens) {
      if (clean) return false;  // the server keeps closing an idle stream: nothing more to wait for here
      throw Error(where, "the log stream of the running container keeps failing (" + std::to_string(fruitless) +
                             " attempts without a new line): " + cut);
    }
    log_debug("the log stream of " + pod + " " + (clean ? "ended" : "was cut (" + cut + ")") +
              " while the container runs; reopening it from " +
              (resume.time_ns >= 0 ? format_rfc3339(resume.time_ns / 1000000000) : std::string("the start")));
    if (fruitless > 0) std::this_thread::sleep_for(std::chrono::duration<double>(poll_interval_ * fruitless));
  }
}

std::vector<v1alpha1::TrainingRuntime> KubernetesBackend::runtimes() {
  std::vector<v1alpha1::TrainingRuntime> out;
  const std::string base = "/apis/trainer.kubeflow.org/v1alpha1/";
  for (const std::string& path : {base + "clustertrainingruntimes",
                                  base + "namespaces/" + hub::url_encode(namespace_, false) + "/trainingruntimes"}) {
    Json list;
    try {
      list = request("GET", path);
    } catch (const KubernetesApiError& e) {
      // No such resource (Kubeflow Trainer not installed): nothing there. Not allowed to list one
      // scope (RBAC): the other scope's runtimes still serve, said once. Anything else is an error
      // (upstream raises for all but 404).
      if (e.status() == 404) {
        log_debug("runtimes: " + std::string(e.what()));
      } else if (e.status() == 403) {
        if (warned_forbidden_.insert(path).second)
          log_warn("runtimes: not allowed to list " + path + " (" + e.what() + "); its runtimes are not offered");
      } else {
        throw;
      }
      continue;
    }
    if (!json_field(list, "items").is_array()) continue;
    const std::string kind = path.find("/clustertrainingruntimes") != std::string::npos ? v1alpha1::kClusterTrainingRuntimeKind
                                                                                    : v1alpha1::kTrainingRuntimeKind;
    for (Json item : list["items"]) {
      // List items carry no apiVersion/kind; the reader wants them.
      item["apiVersion"] = "trainer.kubeflow.org/v1alpha1";
      item["kind"] = kind;
      try {
        out.push_back(v1alpha1::runtime_from_json(item, path + ": " + json_text(json_field(item, "metadata"), "name")));
      } catch (const Error& e) {
        log_warn("skipping a runtime the cluster holds: " + std::string(e.what()));
      }
    }
  }
  return out;
}

void KubernetesBackend::delete_job(const std::string& name, bool /*remove_workspace*/) {
  try {
    request("DELETE", trainjobs_path() + "/" + hub::url_encode(name, false));
  } catch (const KubernetesApiError& e) {
    if (e.status() == 404)
      throw KubernetesApiError("TrainJob " + namespace_ + "/" + name, std::string("not found: ") + e.what(), 404);
    throw;
  }
  // Normally garbage-collected through its owner reference; gone already is fine.
  try {
    request("DELETE", "/api/v1/namespaces/" + hub::url_encode(namespace_, false) + "/secrets/" +
                          hub::url_encode(name + "-ktune-secrets", false));
  } catch (const KubernetesApiError& e) {
    if (e.status() != 404) log_warn("could not delete the Secret " + name + "-ktune-secrets: " + std::string(e.what()));
  }
}

}  // namespace ktune::sdk
