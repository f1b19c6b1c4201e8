// Exports on the cluster (see kubernetes_backend.h, "export", and docs/kubernetes.md). Only a pod
// that mounts the TrainJob's volume can read its outputs, so the exporter runs as a batch/v1 Job:
//   <job>-export            the exporter in the runtime's initializer image (it holds `ktune`),
//                           the claim <template>-<job> mounted read-only where the trainer had it,
//                           backoffLimit 0 (an upload that failed is reported, not retried blindly:
//                           the exporter retries its own requests), owned by the TrainJob
//   <job>-export-secrets    the destination's credentials, referenced by secretKeyRef
// and its record lives in the TrainJob's annotation ktune.dev/exports (a JSON list).
#include <algorithm>
#include <chrono>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "hub/aws_config.h"
#include "hub/storage_uri.h"
#include "sdk/kubernetes_backend.h"
#include "sdk/kube_objects.h"
#include "sdk/local_backend.h"

namespace ktune::sdk {

namespace {

using Json = v1alpha1::Json;

constexpr const char* kExportContainer = "exporter";
constexpr const char* kDefaultInitializerImage = "ghcr.io/ktune/ktune-initializer:0.1.0";

std::string export_job_name(const std::string& job) { return job + "-export"; }
std::string export_secret_name(const std::string& job) { return job + "-export-secrets"; }

Json owner_of(const Json& trainjob) {
  const Json& meta = json_field(trainjob, "metadata");
  return Json::array({{{"apiVersion", "trainer.kubeflow.org/v1alpha1"},
                       {"kind", "TrainJob"},
                       {"name", json_text(meta, "name")},
                       {"uid", json_text(meta, "uid")}}});
}

// The runtime's workspace: the first volumeClaimPolicies template (JobSet names its claim
// <template>-<jobset>) and where the trainer's containers mount it.
struct Workspace {
  std::string claim_template;
  std::string mount_path;
};

std::optional<Workspace> workspace_of(const v1alpha1::TrainingRuntime& runtime) {
  const Json& policies = json_field(json_field(runtime.template_, "spec"), "volumeClaimPolicies");
  if (!policies.is_array()) return std::nullopt;
  for (const Json& policy : policies)
    for (const Json& t : json_field(policy, "templates").is_array() ? json_field(policy, "templates") : Json::array()) {
      const std::string name = json_text(json_field(t, "metadata"), "name");
      if (name.empty()) continue;
      for (const v1alpha1::ReplicatedJob& job : runtime.replicated_jobs())
        for (const v1alpha1::Container& c : job.containers)
          for (const v1alpha1::VolumeMount& m : c.volume_mounts)
            if (m.name == name) return Workspace{name, m.mount_path};
      return Workspace{name, "/workspace"};
    }
  return std::nullopt;
}

Json export_record_json(const ExportRecord& e) {
  Json j = {{"id", e.id},
            {"status", e.status},
            {"destination", e.destination},
            {"parts", e.parts},
            {"startedAt", e.started_at},
            {"finishedAt", e.finished_at}};
  if (!e.summary_json.empty()) j["summary"] = Json::parse(e.summary_json, nullptr, false);
  if (!e.error.empty()) j["error"] = e.error;
  return j;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

std::string KubernetesBackend::namespace_path() const { return "/api/v1/namespaces/" + hub::url_encode(namespace_, false); }

void KubernetesBackend::post_until_free(const std::string& path, const std::string& body) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (;;) {
    try {
      request("POST", path, body);
      return;
    } catch (const KubernetesApiError& err) {
      // A deleted Job or Secret can linger a moment (background deletion, finalizers).
      if (err.status() != 409 || std::chrono::steady_clock::now() >= deadline) throw;
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(std::min(poll_interval_, 1.0)));
  }
}

std::vector<ExportRecord> KubernetesBackend::exports_of(const Json& trainjob) const {
  std::vector<ExportRecord> out;
  const std::string annotation = json_text(json_field(json_field(trainjob, "metadata"), "annotations"), kExportsAnnotation);
  if (annotation.empty()) return out;
  const Json list = Json::parse(annotation, nullptr, false);
  if (!list.is_array()) {
    log_warn("TrainJob " + json_text(json_field(trainjob, "metadata"), "name") + ": its " + kExportsAnnotation +
             " annotation is not a JSON list; its exports are not shown");
    return out;
  }
  for (const Json& j : list) {
    ExportRecord e;
    e.id = json_field(j, "id").is_number_integer() ? json_field(j, "id").get<int>() : int(out.size()) + 1;
    e.status = json_text(j, "status");
    e.destination = json_text(j, "destination");
    e.parts = json_text(j, "parts");
    e.started_at = json_field(j, "startedAt").is_number() ? json_field(j, "startedAt").get<double>() : 0;
    e.finished_at = json_field(j, "finishedAt").is_number() ? json_field(j, "finishedAt").get<double>() : 0;
    if (json_field(j, "summary").is_object()) e.summary_json = json_field(j, "summary").dump();
    e.error = json_text(j, "error");
    out.push_back(std::move(e));
  }
  return out;
}

void KubernetesBackend::record_exports(const std::string& job, const std::vector<ExportRecord>& exports) {
  Json list = Json::array();
  for (const ExportRecord& e : exports) list.push_back(export_record_json(e));
  const Json patch = {{"metadata", {{"annotations", {{kExportsAnnotation, list.dump()}}}}}};
  request("PATCH", trainjobs_path() + "/" + hub::url_encode(job, false), patch.dump(), "application/merge-patch+json");
}

Json KubernetesBackend::export_job_object(const std::string& job, const KubernetesExport& e, const Json& trainjob) {
  const Json& ref = json_field(json_field(trainjob, "spec"), "runtimeRef");
  const std::string kind = json_text(ref, "kind").empty() ? v1alpha1::kClusterTrainingRuntimeKind : json_text(ref, "kind");
  const v1alpha1::TrainingRuntime* runtime = runtime_of(kind, json_text(ref, "name"));
  if (runtime == nullptr)
    throw Error("TrainJob " + job, "its runtime " + kind + " " + json_text(ref, "name") +
                                       " cannot be read: the export needs its volume and initializer image");
  const std::optional<Workspace> workspace = workspace_of(*runtime);
  if (!workspace)
    throw Error("TrainJob " + job, "its runtime " + json_text(ref, "name") +
                                       " keeps no volume (spec.template.spec.volumeClaimPolicies): its outputs went with its pods");
  std::string image = e.image;
  if (image.empty())
    if (const auto init = runtime->find_replicated_job("dataset-initializer"); init && !init->containers.empty())
      image = init->containers.front().image;
  if (image.empty()) image = kDefaultInitializerImage;

  Json command = Json::array({"ktune", "export", "--from", workspace->mount_path + "/output", "--to", e.destination});
  for (const std::string& a : e.args) command.push_back(a);
  Json env = Json::array();
  for (const auto& [k, v] : e.env) env.push_back({{"name", k}, {"value", v}});
  for (const auto& [k, v] : e.secret_env)
    env.push_back({{"name", k}, {"valueFrom", {{"secretKeyRef", {{"name", export_secret_name(job)}, {"key", k}}}}}});
  const Json labels = {{"app.kubernetes.io/managed-by", "ktune"},
                       {"trainer.kubeflow.org/trainjob-name", job},
                       {"ktune.dev/role", "export"}};
  return {{"apiVersion", "batch/v1"},
          {"kind", "Job"},
          {"metadata",
           {{"name", export_job_name(job)}, {"namespace", namespace_}, {"labels", labels}, {"ownerReferences", owner_of(trainjob)}}},
          {"spec",
           {{"backoffLimit", 0},
            {"template",
             {{"metadata", {{"labels", labels}}},
              {"spec",
               {{"restartPolicy", "Never"},
                {"containers",
                 Json::array({{{"name", kExportContainer},
                               {"image", image},
                               {"command", command},
                               {"env", env},
                               {"volumeMounts", Json::array({{{"name", workspace->claim_template},
                                                              {"mountPath", workspace->mount_path},
                                                              {"readOnly", true}}})}}})},
                {"volumes", Json::array({{{"name", workspace->claim_template},
                                          {"persistentVolumeClaim",
                                           {{"claimName", workspace->claim_template + "-" + job}, {"readOnly", true}}}}})}}}}}}}};
}

// What the export Job runs for a request: the exporter's flags, and the destination's settings as
// the exporter's environment (credentials into the Secret).
static KubernetesExport kubernetes_export_of(const ExportRequest& request) {
  const hub::StorageUri uri = hub::parse_storage_uri(request.destination);
  const hub::StorageOptions& options = request.storage;
  KubernetesExport e;
  e.destination = request.destination;
  e.parts = hub::export_parts_name(request.parts);
  if (request.parts != hub::ExportParts::Available) e.args.insert(e.args.end(), {"--parts", e.parts});
  if (request.epoch >= 0) e.args.insert(e.args.end(), {"--epoch", std::to_string(request.epoch)});
  switch (uri.scheme) {
    case hub::StorageScheme::File:
      throw Error("export to " + request.destination, "a file:// destination on the cluster would be written inside "
                                                      "the export pod and lost with it; export to s3:// or hf://");
    case hub::StorageScheme::HuggingFace:
      if (!options.hf_token.empty()) e.secret_env["HF_TOKEN"] = options.hf_token;
      if (!options.hf_endpoint.empty()) e.env["HF_ENDPOINT"] = options.hf_endpoint;
      if (options.hf_repo_type != hub::HfRepoType::Model) e.args.insert(e.args.end(), {"--repo-type", "dataset"});
      if (options.hf_revision != "main") e.args.insert(e.args.end(), {"--revision", options.hf_revision});
      break;
    case hub::StorageScheme::S3: {
      // This machine's ~/.aws profile fills what is unset (the pod has none): its region, endpoints and
      // keys. A role the profile assumes stays here: its source keys or token file are not shipped.
      hub::S3Options s3 = options.s3;
      hub::apply_aws_profile(s3);
      if (s3.role_arn != options.s3.role_arn || !s3.role_external_id.empty())
        throw Error("export to " + request.destination,
                    "AWS profile '" + s3.profile.name + "' assumes role " + s3.role_arn +
                        ", which the export pod cannot do without this machine's credentials; pass role_arn with an "
                        "access key, or export with the local backend");
      if (!s3.credentials.access_key_id.empty()) e.secret_env["AWS_ACCESS_KEY_ID"] = s3.credentials.access_key_id;
      if (!s3.credentials.secret_access_key.empty()) e.secret_env["AWS_SECRET_ACCESS_KEY"] = s3.credentials.secret_access_key;
      if (!s3.credentials.session_token.empty()) e.secret_env["AWS_SESSION_TOKEN"] = s3.credentials.session_token;
      if (!s3.endpoint.empty()) e.env["AWS_ENDPOINT_URL"] = s3.endpoint;
      if (!s3.role_arn.empty()) e.args.insert(e.args.end(), {"--role-arn", s3.role_arn});
      if (!s3.sts_endpoint.empty()) e.env["AWS_ENDPOINT_URL_STS"] = s3.sts_endpoint;
      if (!s3.role_session_name.empty()) e.env["AWS_ROLE_SESSION_NAME"] = s3.role_session_name;
      if (!s3.region.empty()) e.env["AWS_REGION"] = s3.region;
      break;
    }
  }
  return e;
}

ExportRecord KubernetesBackend::export_job(const std::string& name, const ExportRequest& request, const LogLineSink& sink) {
  const ExportRecord started = start_export(name, kubernetes_export_of(request));
  log_info("export " + std::to_string(started.id) + " of TrainJob " + name + " to " + redact(request.destination) +
           ": Job " + name + "-export in namespace " + kubernetes_namespace());
  const ExportRecord done = wait_for_export(name, [&](const std::string& line) { return sink ? sink(redact(line)) : true; },
                                            request.timeout_seconds, request.while_waiting);
  if (done.status == kFailed) throw Error("export of TrainJob " + name, done.error);
  return done;
}

ExportRecord KubernetesBackend::start_export(const std::string& job, const KubernetesExport& e) {
  Json trainjob;
  try {
    trainjob = request("GET", trainjobs_path() + "/" + hub::url_encode(job, false));
  } catch (const KubernetesApiError& err) {
    if (err.status() == 404) throw KubernetesApiError("TrainJob " + namespace_ + "/" + job, std::string("not found: ") + err.what(), 404);
    throw;
  }
  const TrainJobRecord record = record_of(trainjob);
  if (record.status != kComplete)
    throw Error("TrainJob " + job, "is " + record.status + "; only a Complete job's outputs are exported");
  const std::string jobs_path = "/apis/batch/v1/namespaces/" + hub::url_encode(namespace_, false) + "/jobs";
  const std::string job_path = jobs_path + "/" + hub::url_encode(export_job_name(job), false);
  std::vector<ExportRecord> exports = exports_of(trainjob);
  if (!exports.empty() && exports.back().status == kRunning) {
    // An export nobody followed to its end (its CLI stopped or timed out): settled from its Job now,
    // and refused only while that Job still runs.
    Json status;
    bool gone = false;
    try {
      status = json_field(request("GET", job_path), "status");
    } catch (const KubernetesApiError& err) {
      if (err.status() != 404) throw;
      gone = true;
    }
    const bool ended = (json_field(status, "succeeded").is_number_integer() && json_field(status, "succeeded").get<int>() > 0) ||
                       (json_field(status, "failed").is_number_integer() && json_field(status, "failed").get<int>() > 0);
    if (gone) {
      exports.back().status = kFailed;
      exports.back().error = "its Job " + export_job_name(job) + " is gone; the export's end was not seen";
      exports.back().finished_at = now_seconds();
      record_exports(job, exports);
    } else if (ended) {
      exports.back() = wait_for_export(job, nullptr, 0);
    } else {
      throw Error("TrainJob " + job, "export " + std::to_string(exports.back().id) + " to " + exports.back().destination +
                                         " is still running (Job " + export_job_name(job) + "): wait for it, or delete that Job");
    }
  }
  const Json object = export_job_object(job, e, trainjob);

  // An earlier export's Job and Secret (finished: its record says so) make way for this one.
  for (const std::string& path : {job_path + "?propagationPolicy=Background",
                                  namespace_path() + "/secrets/" + hub::url_encode(export_secret_name(job), false)}) {
    try {
      request("DELETE", path);
    } catch (const KubernetesApiError& err) {
      if (err.status() != 404) throw;
    }
  }
  if (!e.secret_env.empty()) {
    Json secret = credentials_secret(export_secret_name(job), namespace_, job, e.secret_env);
    secret["metadata"]["ownerReferences"] = owner_of(trainjob);
    post_until_free(namespace_path() + "/secrets", secret.dump());
  }
  post_until_free(jobs_path, object.dump());

  ExportRecord started;
  started.id = exports.empty() ? 1 : exports.back().id + 1;
  started.destination = e.destination;
  started.parts = e.parts;
  started.started_at = now_seconds();
  exports.push_back(started);
  record_exports(job, exports);
  return started;
}

ExportRecord KubernetesBackend::wait_for_export(const std::string& job, const LogLineSink& sink, double timeout_seconds,
                                               const std::function<void()>& while_waiting) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
  const std::string job_path = "/apis/batch/v1/namespaces/" + hub::url_encode(namespace_, false) + "/jobs/" +
                               hub::url_encode(export_job_name(job), false);
  // Its pods by the Job's uid: an earlier export's pods (same Job name) may still be going away.
  const std::string uid = json_text(json_field(request("GET", job_path), "metadata"), "uid");
  const std::string pods_path = namespace_path() + "/pods?labelSelector=" +
                                hub::url_encode("batch.kubernetes.io/controller-uid=" + uid, false);
  std::string pod;
  std::vector<std::string> lines;  // the exporter's output: its summary is the last JSON line
  auto keep = [&](const std::string& line) {
    lines.push_back(line);
    return sink ? sink(line) : true;
  };
  std::string outcome;  // kComplete | kFailed once the Job says so
  while (outcome.empty()) {
    const Json status = json_field(request("GET", job_path), "status");
    if (json_field(status, "succeeded").is_number_integer() && json_field(status, "succeeded").get<int>() > 0) outcome = kComplete;
    else if (json_field(status, "failed").is_number_integer() && json_field(status, "failed").get<int>() > 0) outcome = kFailed;
    if (pod.empty()) {  // the export's pod, once it has left Pending (or the Job ended)
      const Json pods = request("GET", pods_path);
      for (const Json& p : json_field(pods, "items").is_array() ? json_field(pods, "items") : Json::array())
        if (json_text(json_field(p, "status"), "phase") != "Pending" || !outcome.empty()) pod = json_text(json_field(p, "metadata"), "name");
      if (!pod.empty()) {
        read_pod_log(pod, kExportContainer, /*follow=*/outcome.empty(), keep);
        continue;  // the Job's outcome, now that its container has ended
      }
    }
    if (!outcome.empty()) break;
    if (std::chrono::steady_clock::now() >= deadline) break;
    if (while_waiting) while_waiting();
    std::this_thread::sleep_for(std::chrono::duration<double>(poll_interval_));
  }

  Json trainjob = request("GET", trainjobs_path() + "/" + hub::url_encode(job, false));
  std::vector<ExportRecord> exports = exports_of(trainjob);
  if (exports.empty()) throw Error("TrainJob " + job, std::string("has no export record (") + kExportsAnnotation + ")");
  ExportRecord& e = exports.back();
  if (outcome.empty()) return e;  // still running: left to run, recorded as it is
  e.status = outcome;
  e.finished_at = now_seconds();
  for (auto it = lines.rbegin(); it != lines.rend(); ++it) {
    const Json summary = Json::parse(*it, nullptr, false);
    if (outcome == kComplete && summary.is_object() && summary.contains("destination")) {
      e.summary_json = summary.dump();
      break;
    }
    if (outcome == kFailed && !it->empty()) {
      e.error = redact(*it);
      break;
    }
  }
  if (outcome == kFailed && e.error.empty()) e.error = "the export Job " + export_job_name(job) + " failed (its pod left no log)";
  record_exports(job, exports);
  return e;
}

}  // namespace ktune::sdk
