// Validation: the checks that need no runtime (name, runtimeRef), the runtime's existence, then
// every plugin's enforce_ml_policy and validate (see plugins.h), all errors collected in order.
#include "runtime/validation.h"

#include <regex>

#include "runtime/plugins.h"

namespace ktune {

bool is_rfc1035_label(const std::string& name) {
  static const std::regex re("^[a-z]([-a-z0-9]*[a-z0-9])?$");
  return name.size() <= 63 && std::regex_match(name, re);
}

// A label or annotation key as the API server takes it: an optional DNS-subdomain prefix and '/',
// then a name of at most 63 characters, alphanumeric at both ends, '-', '_' and '.' between. "" if
// valid, else what is wrong.
static std::string metadata_key_problem(const std::string& key) {
  static const std::regex name_re("^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$");
  static const std::regex prefix_re("^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$");
  const std::size_t slash = key.find('/');
  const std::string name = slash == std::string::npos ? key : key.substr(slash + 1);
  if (slash != std::string::npos) {
    const std::string prefix = key.substr(0, slash);
    if (prefix.empty() || prefix.size() > 253 || !std::regex_match(prefix, prefix_re))
      return "its prefix must be a DNS subdomain (lower-case alphanumerics, '-' and '.', at most 253 characters)";
  }
  if (name.empty() || name.size() > 63 || !std::regex_match(name, name_re))
    return "its name must be at most 63 characters, alphanumeric at both ends, with '-', '_' or '.' between";
  return "";
}

static bool is_label_value(const std::string& value) {
  static const std::regex re("^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$");
  return value.size() <= 63 && std::regex_match(value, re);
}

// metadata.labels and .annotations, spec.activeDeadlineSeconds: the API server's rules, checked
// before a job is made so that a mistake names its key here, not in a 422 from the cluster.
static void validate_metadata(const v1alpha1::TrainJob& job, std::vector<Error>& errors) {
  for (const auto& [key, value] : job.metadata.labels) {
    const std::string field = "metadata.labels[" + key + "]";
    if (std::string problem = metadata_key_problem(key); !problem.empty()) errors.emplace_back(field, "bad key: " + problem);
    if (!is_label_value(value))
      errors.emplace_back(field, "bad value \"" + value + "\": at most 63 characters, empty or alphanumeric at both "
                                 "ends with '-', '_' or '.' between");
  }
  std::size_t annotation_bytes = 0;
  for (const auto& [key, value] : job.metadata.annotations) {
    if (std::string problem = metadata_key_problem(key); !problem.empty())
      errors.emplace_back("metadata.annotations[" + key + "]", "bad key: " + problem);
    annotation_bytes += key.size() + value.size();
  }
  if (annotation_bytes > 256 * 1024)
    errors.emplace_back("metadata.annotations", "may hold at most 256 KiB in all; got " + std::to_string(annotation_bytes) + " bytes");
  if (job.spec.active_deadline_seconds && *job.spec.active_deadline_seconds < 1)
    errors.emplace_back("spec.activeDeadlineSeconds", "must be a positive integer (minimum 1); got " +
                                                          std::to_string(*job.spec.active_deadline_seconds));
}

std::vector<Error> validate(const v1alpha1::TrainJob& job, const RuntimeCatalog& catalog) {
  std::vector<Error> errors;
  const std::string& name = job.metadata.name;
  if (name.empty()) {
    errors.emplace_back("metadata.name", "is required");
  } else {
    static const std::regex re("^[a-z]([-a-z0-9]*[a-z0-9])?$");
    if (!std::regex_match(name, re))
      errors.emplace_back("metadata.name", "must match RFC 1035 DNS label format ^[a-z]([-a-z0-9]*[a-z0-9])?$ "
                                           "(lower-case letters, digits and '-', starting with a letter); got \"" +
                                               name + "\"");
    if (name.size() > 63)
      errors.emplace_back("metadata.name", "must be no more than 63 characters; got " + std::to_string(name.size()));
  }
  validate_metadata(job, errors);
  const v1alpha1::RuntimeRef& ref = job.spec.runtime_ref;
  if (ref.api_group != v1alpha1::kGroup)
    errors.emplace_back("spec.runtimeRef.apiGroup", "must be trainer.kubeflow.org; got \"" + ref.api_group + "\"");
  if (ref.kind != v1alpha1::kClusterTrainingRuntimeKind && ref.kind != v1alpha1::kTrainingRuntimeKind)
    errors.emplace_back("spec.runtimeRef.kind", "must be ClusterTrainingRuntime or TrainingRuntime; got \"" + ref.kind + "\"");

  const v1alpha1::TrainingRuntime* runtime = ref.name.empty() ? nullptr : catalog.find(ref.name);
  if (runtime == nullptr) {
    std::string available;
    for (const std::string& n : catalog.names()) available += (available.empty() ? "" : ", ") + n;
    errors.emplace_back("spec.runtimeRef.name", (ref.name.empty() ? std::string("is required")
                                                                  : "runtime " + ref.name + " not found") +
                                                    "; available: " + (available.empty() ? "none" : available));
    return errors;
  }
  if (runtime->kind != ref.kind &&
      (ref.kind == v1alpha1::kClusterTrainingRuntimeKind || ref.kind == v1alpha1::kTrainingRuntimeKind))
    errors.emplace_back("spec.runtimeRef.kind", "runtime " + ref.name + " is a " + runtime->kind + ", not a " + ref.kind);

  RuntimeInfo info = make_runtime_info(job, *runtime, catalog.configs());
  std::vector<Error> plugin_errors = run_plugin_validation(info);
  errors.insert(errors.end(), plugin_errors.begin(), plugin_errors.end());
  return errors;
}

void validate_or_throw(const v1alpha1::TrainJob& job, const RuntimeCatalog& catalog) {
  std::vector<Error> errors = validate(job, catalog);
  if (!errors.empty()) throw Errors(std::move(errors));
}

}  // namespace ktune
