// The Kubeflow Trainer API objects, trainer.kubeflow.org/v1alpha1: TrainJob, TrainingRuntime and
// ClusterTrainingRuntime, with the same field names, read from and written to YAML or JSON.
//
// Unknown fields: the Trainer API's own fields (TrainJob spec, trainer, initializer, runtimeRef;
// runtime spec, mlPolicy, torch) are typed, and an unknown key there is REFUSED with an Error naming
// its path (`spec.trainer.numNode`), because a misspelt field that is silently dropped trains the
// wrong job. Embedded Kubernetes objects that ktune does not interpret (metadata beyond name,
// namespace, labels and annotations; the JobSet template; podGroupPolicy; runtimePatches; the
// other ML policies; env valueFrom) are kept verbatim as JSON and written back unchanged.
//
// It does not validate the training semantics (see validation.h) and does not talk to a cluster.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ktune::v1alpha1 {

using Json = nlohmann::ordered_json;

inline constexpr const char* kGroup = "trainer.kubeflow.org";
inline constexpr const char* kApiVersion = "trainer.kubeflow.org/v1alpha1";
inline constexpr const char* kTrainJobKind = "TrainJob";
inline constexpr const char* kClusterTrainingRuntimeKind = "ClusterTrainingRuntime";
inline constexpr const char* kTrainingRuntimeKind = "TrainingRuntime";
// Labels the runtimes and their replicated jobs carry.
inline constexpr const char* kFrameworkLabel = "trainer.kubeflow.org/framework";
inline constexpr const char* kAncestorLabel = "trainer.kubeflow.org/trainjob-ancestor-step";

struct ObjectMeta {
  std::string name;
  std::string namespace_;                         // "namespace" in YAML
  std::map<std::string, std::string> labels;
  std::map<std::string, std::string> annotations;
  Json extra = Json::object();                    // every other metadata field, verbatim
};

// core/v1 EnvVar: a literal value, or a valueFrom kept verbatim.
struct EnvVar {
  std::string name;
  std::optional<std::string> value;
  Json value_from;                                // null unless valueFrom is set
};

// core/v1 ResourceRequirements; quantities as written ("2", "500m", "16Gi").
struct ResourceRequirements {
  std::map<std::string, std::string> limits;
  std::map<std::string, std::string> requests;
  Json claims;                                    // null unless set
  bool empty() const { return limits.empty() && requests.empty() && claims.is_null(); }
};

struct RuntimeRef {
  std::string name;
  std::string api_group = kGroup;
  std::string kind = kClusterTrainingRuntimeKind;
};

// spec.initializer.dataset and spec.initializer.model have the same shape.
struct InitializerSpec {
  std::optional<std::string> storage_uri;
  std::vector<EnvVar> env;
  std::optional<std::string> secret_ref;          // secretRef.name
};

struct Initializer {
  std::optional<InitializerSpec> dataset;
  std::optional<InitializerSpec> model;
};

struct Trainer {
  std::optional<std::string> image;
  std::vector<std::string> command;               // empty: the runtime's node command
  std::vector<std::string> args;
  std::vector<EnvVar> env;
  std::optional<int> num_nodes;
  // "" when unset (auto), else "auto", "cpu", "gpu" (older API versions) or a positive integer.
  // Written back as an integer only (the current CRD's type); "auto" is written as absent.
  std::string num_proc_per_node;
  std::optional<ResourceRequirements> resources_per_node;
};

struct TrainJobSpec {
  RuntimeRef runtime_ref;
  std::optional<Initializer> initializer;
  std::optional<Trainer> trainer;
  std::optional<bool> suspend;
  std::optional<std::int64_t> active_deadline_seconds;
  std::optional<std::string> managed_by;
  std::map<std::string, std::string> labels;       // older API versions: spec.labels
  std::map<std::string, std::string> annotations;  // older API versions: spec.annotations
  Json runtime_patches;                            // verbatim, null unless set
  Json pod_template_overrides;                     // older API versions, verbatim, null unless set
};

struct Condition {
  std::string type;                                // "Suspended", "Complete", "Failed", ...
  std::string status;                              // "True" | "False" | "Unknown"
  std::string reason;
  std::string message;
  std::string last_transition_time;                // RFC 3339
};

struct JobStatus {
  std::string name;
  int active = 0, ready = 0, succeeded = 0, failed = 0, suspended = 0;
};

struct Metric {
  std::string name;
  std::string value;                               // serialized as a string, as the CRD says
};

struct TrainerStatus {
  std::optional<int> progress_percentage;          // 0..100
  std::optional<std::int64_t> estimated_remaining_seconds;
  std::vector<Metric> metrics;
  std::string last_updated_time;                   // RFC 3339, "" when unknown
};

struct TrainJobStatus {
  std::vector<Condition> conditions;
  std::vector<JobStatus> jobs_status;
  std::optional<TrainerStatus> trainer_status;
};

struct TrainJob {
  ObjectMeta metadata;
  TrainJobSpec spec;
  std::optional<TrainJobStatus> status;
};

// ---- runtimes -----------------------------------------------------------------------------

struct TorchPolicy {
  std::string num_proc_per_node;                   // older API: "auto" | "cpu" | "gpu" | integer; "" unset
  Json env_injection;                              // verbatim, null unless set
};

struct MLPolicy {
  std::optional<int> num_nodes;
  std::optional<TorchPolicy> torch;
  Json mpi, jax, xgboost, flux;                    // verbatim, null unless set (presence matters)
};

// A view of one JobSet replicatedJob, read from the verbatim template (see replicated_jobs()).
struct VolumeMount {
  std::string name;
  std::string mount_path;
};

struct Container {
  std::string name;
  std::string image;
  std::vector<std::string> command;
  std::vector<std::string> args;
  std::vector<EnvVar> env;
  ResourceRequirements resources;
  std::vector<VolumeMount> volume_mounts;
};

struct DependsOn {
  std::string name;
  std::string status;                              // "Complete" | "Ready"
};

struct ReplicatedJob {
  std::string name;                                // "dataset-initializer", "model-initializer", "node"
  int replicas = 1;
  std::string ancestor;                            // trainer.kubeflow.org/trainjob-ancestor-step label
  std::vector<DependsOn> depends_on;
  std::vector<Container> containers;
  const Container* find_container(const std::string& container_name) const;
};

// Used for both kinds: `kind` says which.
struct TrainingRuntime {
  std::string kind = kClusterTrainingRuntimeKind;
  ObjectMeta metadata;
  MLPolicy ml_policy;                              // spec.mlPolicy
  Json pod_group_policy;                           // spec.podGroupPolicy, verbatim, null unless set
  Json template_ = Json::object();                 // spec.template (a JobSet template), verbatim

  std::string framework() const;                   // the framework label, "" when absent
  std::vector<ReplicatedJob> replicated_jobs() const;  // template.spec.replicatedJobs
  // The job whose ancestor label is `ancestor` ("trainer", "dataset-initializer", ...), else the
  // job named like it ("node" for "trainer"); nullopt when neither exists.
  std::optional<ReplicatedJob> find_replicated_job(const std::string& ancestor) const;
};

// ---- reading and writing -------------------------------------------------------------------
// `where` names the source ("manifests/x.yaml", "trainjob.json") in every Error raised.

TrainJob trainjob_from_json(const Json& doc, const std::string& where);
Json to_json(const TrainJob& job);

TrainingRuntime runtime_from_json(const Json& doc, const std::string& where);
Json to_json(const TrainingRuntime& runtime);

// YAML <-> JSON trees. Scalars keep YAML 1.2 core typing (true/false, integers, floats, null);
// quoted scalars stay strings.
std::vector<Json> parse_yaml_documents(const std::string& text, const std::string& where);
std::vector<Json> load_yaml_file(const std::string& path);
std::string to_yaml(const Json& doc);

// Convenience: YAML text of the object, as `kubectl apply -f` takes it.
std::string to_yaml(const TrainJob& job);
std::string to_yaml(const TrainingRuntime& runtime);

}  // namespace ktune::v1alpha1
