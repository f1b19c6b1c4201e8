// Planning: validate, then run the plugins in their fixed order (enforce the ML policy, mutate,
// build steps) and collect the plan. Also the TrainJob YAML a Kubernetes backend would create.
#include "runtime/planner.h"

#include "runtime/plugins.h"
#include "runtime/trainjob_builder.h"
#include "runtime/validation.h"

namespace ktune {

TrainJobPlan build_plan(const v1alpha1::TrainJob& job, const RuntimeCatalog& catalog) {
  validate_or_throw(job, catalog);
  const v1alpha1::TrainingRuntime& runtime = catalog.get(job.spec.runtime_ref.name);
  RuntimeInfo info = make_runtime_info(job, runtime, catalog.configs());
  for (const auto& p : plugins()) p->enforce_ml_policy(info);
  for (const auto& p : plugins()) p->mutate(info);

  TrainJobPlan plan;
  plan.job_name = job.metadata.name;
  plan.runtime_name = runtime.metadata.name;
  plan.framework = runtime.framework();
  plan.trainer_type = plan.framework == "torchtune" ? "BuiltinTrainer" : "CustomTrainer";
  plan.num_nodes = info.num_nodes;
  plan.num_proc_per_node = info.num_proc_per_node;
  plan.model_key = info.model_key;
  plan.recipe = info.recipe;
  plan.config = info.config;
  for (const auto& p : plugins()) p->build_steps(info, plan);
  return plan;
}

TrainJobPlan build_plan(const v1alpha1::TrainJob& job, const v1alpha1::TrainingRuntime& runtime) {
  RuntimeCatalog catalog;  // the default config set
  catalog.add(runtime);
  return build_plan(job, catalog);
}

std::string render_trainjob_yaml(const v1alpha1::TrainJob& job, bool with_secrets) {
  v1alpha1::TrainJob copy = job;
  if (!with_secrets) {
    auto mask = [](std::vector<v1alpha1::EnvVar>& env) {
      for (v1alpha1::EnvVar& e : env)
        if (e.value && is_secret_env_name(e.name)) e.value = "***";
    };
    if (copy.spec.initializer) {
      if (copy.spec.initializer->dataset) mask(copy.spec.initializer->dataset->env);
      if (copy.spec.initializer->model) mask(copy.spec.initializer->model->env);
    }
    if (copy.spec.trainer) mask(copy.spec.trainer->env);
  }
  return v1alpha1::to_yaml(copy);
}

}  // namespace ktune
