// KubernetesBackend: TrainerClient's backend for a cluster running the Kubeflow Trainer controller.
// It speaks the API server's REST interface (libcurl through hub::HttpClient) with the credentials
// of a kubeconfig or the in-cluster service account (kube_config.h):
//   submit      POST the plan's TrainJob (trainer.kubeflow.org/v1alpha1, namespaced `trainjobs`),
//               after a Secret <job>-ktune-secrets holding the secret env values the TrainJob
//               references (valueFrom.secretKeyRef); the Secret is then owned by the TrainJob
//               (ownerReferences), so the cluster deletes it with the job.
//   get/list    the TrainJob's status as upstream's SDK derives it: Complete or Failed from a
//               condition with status "True"; else Running when every node pod is Running or
//               Succeeded; else Created. Steps from the job's pods, selected by the labels
//               jobset.sigs.k8s.io/jobset-name=<job> and jobset.sigs.k8s.io/replicatedjob-name in
//               (dataset-initializer, model-initializer, launcher, node); a node's step is
//               node-<batch.kubernetes.io/job-completion-index>; the newest pod of a step wins.
//               Pod phases read as ktune's step statuses: Pending → Created, Running → Running,
//               Succeeded → Complete, Failed → Failed. trainerStatus gives the progress.
//   logs        GET pods/<pod>/log?container=<step without -N>, streamed line by line; with
//               follow it first waits for the step's pod to leave Pending, then asks with
//               follow=true&timestamps=true; when the stream ends or is cut while the container
//               still runs (the pod's containerStatuses), it is reopened with sinceTime (the last
//               line's second) and the lines already delivered are skipped by their timestamps, so
//               no line is repeated or lost; once the container has ended, the rest (if any) is
//               read once without follow.
//   delete      DELETE the TrainJob (and the Secret, in case the owner reference was not set).
//   export      `ktune export --job NAME` (kubernetes_export.cpp): a batch/v1 Job <job>-export runs
//               the exporter (`ktune export --from <workspace>/output --to URI`) in the runtime's
//               initializer image with the TrainJob's claim (<template>-<job>, JobSet's name for
//               the runtime's volumeClaimPolicies) mounted read-only, its credentials from a
//               Secret <job>-export-secrets; both owned by the TrainJob. Each export is recorded
//               in the TrainJob's annotation ktune.dev/exports (the local registry's counterpart),
//               which get_job reads back.
// Errors from the API server surface with their status and the Status object's message. The
// bearer token goes only into the Authorization header and is registered as a secret.
// It deliberately does not create runtimes, volumes or pods: the controller does (the runtimes are
// installed from manifests/, see docs/kubernetes.md). remove_workspace has no meaning here.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <memory>
#include <string>
#include <vector>

#include "hub/http_client.h"
#include "runtime/v1alpha1.h"
#include "sdk/backend.h"
#include "sdk/kube_config.h"

namespace ktune::sdk {

// An answer of the API server that is not 2xx: status, reason ("Forbidden") and message.
class KubernetesApiError : public Error {
 public:
  KubernetesApiError(const std::string& where, const std::string& what, long status)
      : Error(where, what), status_(status) {}
  long status() const { return status_; }

 private:
  long status_;
};

// What an export on the cluster runs (KubernetesBackend::start_export).
struct KubernetesExport {
  std::string destination;                        // file://, s3:// or hf:// URI (shown: it holds no secret)
  std::string parts = "available";                // hub::export_parts_name
  std::vector<std::string> args;                  // the exporter's flags after --to (--parts, --epoch, --repo-type, ...)
  std::map<std::string, std::string> env;         // plain settings (AWS_REGION, AWS_ENDPOINT_URL, HF_ENDPOINT)
  std::map<std::string, std::string> secret_env;  // credentials, into the Secret (HF_TOKEN, AWS_*_KEY*, ...)
  std::string image;                              // "" = the image of the runtime's dataset initializer
};

inline constexpr const char* kExportsAnnotation = "ktune.dev/exports";

class KubernetesBackend : public Backend {
 public:
  explicit KubernetesBackend(const BackendConfig& config);  // reads the kubeconfig / service account
  KubernetesBackend(KubeConnection connection, std::string kubernetes_namespace);

  std::string kind() const override { return "kubernetes"; }
  std::string submit(const TrainJobPlan& plan) override;
  std::vector<TrainJobRecord> list_jobs(const std::string& runtime = "") override;
  TrainJobRecord get_job(const std::string& name) override;
  void get_job_logs(const std::string& name, const std::string& step, bool follow,
                    const LogLineSink& sink) override;
  void delete_job(const std::string& name, bool remove_workspace = false) override;
  // The cluster's ClusterTrainingRuntimes and the namespace's TrainingRuntimes (each list that
  // cannot be read, for want of permission or of the CRD, is skipped with a debug line).
  std::vector<v1alpha1::TrainingRuntime> runtimes() override;
  // The namespace's events whose object is the TrainJob, its JobSet (same name), its Jobs or its pods
  // (named <job>-..., or a step's pod), with a firstTimestamp, oldest first (upstream's filter, which
  // misses the Jobs: their names are <job>-<replicated job>-<index>, not a step's).
  std::vector<types::Event> get_job_events(const std::string& name) override;

  // The exact object submit() POSTs for the plan (its TrainJob, in this backend's namespace):
  // what `ktune train --backend kubernetes --dry-run` prints.
  v1alpha1::Json trainjob_object(const TrainJobPlan& plan) const;

  // Exports (kubernetes_export.cpp). start_export: the Secret and the Job for a Complete TrainJob,
  // and its Running record in the annotation; refused while an earlier export of the job runs (a
  // finished one's Job is replaced). export_job_object: the Job it creates. wait_for_export: the
  // export pod's log into `sink` as it runs, then the Job's outcome (the exporter's JSON summary
  // from its log, or its last line as the error), recorded in the annotation and returned; a Job
  // still running after timeout_seconds is left running and its record returned as Running;
  // `while_waiting`, if set, runs between its polls.
  ExportRecord export_job(const std::string& name, const ExportRequest& request, const LogLineSink& sink) override;
  ExportRecord start_export(const std::string& job, const KubernetesExport& request);
  v1alpha1::Json export_job_object(const std::string& job, const KubernetesExport& request, const v1alpha1::Json& trainjob);
  ExportRecord wait_for_export(const std::string& job, const LogLineSink& sink, double timeout_seconds,
                               const std::function<void()>& while_waiting = {});

  const std::string& kubernetes_namespace() const { return namespace_; }
  const KubeConnection& connection() const { return connection_; }
  // Seconds between looks at a pending pod while following its log (tests shorten it).
  void set_poll_interval(double seconds) { poll_interval_ = seconds; }

 private:
  v1alpha1::Json request(const std::string& method, const std::string& path, const std::string& body = "",
                         const std::string& content_type = "application/json");
  TrainJobRecord record_of(const v1alpha1::Json& trainjob);
  const v1alpha1::TrainingRuntime* runtime_of(const std::string& kind, const std::string& name);
  std::string trainjobs_path() const;
  // A submit whose Secret exists (409): throws naming the TrainJob that holds the name, or the Secret.
  [[noreturn]] void refuse_taken_name(const std::string& name, const std::string& secret_name,
                                      const KubernetesApiError& conflict);
  // The state of a pod's container: "running", "waiting", "terminated", or "gone" (no such pod).
  std::string container_state(const std::string& pod, const std::string& container);
  std::string step_pod(const std::string& name, const std::string& step, bool follow, const std::string& previous);
  bool read_pod_log(const std::string& pod, const std::string& container, bool follow, const LogLineSink& sink);
  // The TrainJob's export records (its annotation), and writing them back (a merge patch).
  std::vector<ExportRecord> exports_of(const v1alpha1::Json& trainjob) const;
  void record_exports(const std::string& job, const std::vector<ExportRecord>& exports);
  std::string namespace_path() const;  // /api/v1/namespaces/<ns>
  // POST, waiting out a 409 while an object of that name just deleted is still going away (30 s).
  void post_until_free(const std::string& path, const std::string& body);

  KubeConnection connection_;
  std::string namespace_;
  hub::HttpClient http_;
  double poll_interval_ = 1.0;
  std::map<std::string, std::unique_ptr<v1alpha1::TrainingRuntime>> runtimes_;  // by kind/name; null: unreadable
  std::set<std::string> warned_forbidden_;  // runtime lists this user may not read, said once each
};

// Where a followed log stands: the time of the last line delivered and how many lines with that
// very time were delivered (lines may share a time). time_ns -1: nothing delivered yet.
struct LogResumePoint {
  int64_t time_ns = -1;
  size_t lines_at_time = 0;
};

}  // namespace ktune::sdk
