// TrainJob + runtime -> TrainJobPlan: the plugins run in a fixed order (torch ML policy, torchtune
// mutation, initializers), after validation, and give the ordered steps every backend runs.
//
// It starts nothing (backends do) and never links the engine.
#pragma once

#include "runtime/plan.h"
#include "runtime/runtime_catalog.h"
#include "runtime/v1alpha1.h"

namespace ktune {

// Validates (throws Errors with every problem), then plans. The job's runtimeRef must name a
// runtime of the catalog.
TrainJobPlan build_plan(const v1alpha1::TrainJob& job, const RuntimeCatalog& catalog);
// The same against one runtime (the job's runtimeRef must name it).
TrainJobPlan build_plan(const v1alpha1::TrainJob& job, const v1alpha1::TrainingRuntime& runtime);

// The TrainJob as the plan carries it (TrainJobPlan::trainjob_json): secret env values moved to
// the Secret <job>-ktune-secrets (keys "<dataset|model|trainer>.<NAME>") and referenced by
// valueFrom.secretKeyRef. Fills plan.trainjob_json, secret_name and secret_data.
void attach_trainjob(const v1alpha1::TrainJob& job, TrainJobPlan& plan);

// The TrainJob a Kubernetes backend would create for the job (apiVersion, kind, metadata, spec),
// as YAML; secrets stay out (ACCESS_TOKEN values are written as "***" unless `with_secrets`).
std::string render_trainjob_yaml(const v1alpha1::TrainJob& job, bool with_secrets = false);

}  // namespace ktune
