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
