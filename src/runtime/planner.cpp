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
  attach_trainjob(job, plan);
  return plan;
}

void attach_trainjob(const v1alpha1::TrainJob& job, TrainJobPlan& plan) {
  v1alpha1::TrainJob copy = job;
  const std::string secret = job.metadata.name + "-ktune-secrets";
  plan.secret_data.clear();
  auto move_secrets = [&](std::vector<v1alpha1::EnvVar>& env, const std::string& prefix) {
    for (v1alpha1::EnvVar& e : env)
      if (e.value && is_secret_env_name(e.name)) {
        const std::string key = prefix + "." + e.name;
        plan.secret_data[key] = *e.value;
        e.value.reset();
        e.value_from = {{"secretKeyRef", {{"name", secret}, {"key", key}}}};
      }
  };
  if (copy.spec.initializer) {
    if (copy.spec.initializer->dataset) move_secrets(copy.spec.initializer->dataset->env, "dataset");
    if (copy.spec.initializer->model) move_secrets(copy.spec.initializer->model->env, "model");
  }
  if (copy.spec.trainer) move_secrets(copy.spec.trainer->env, "trainer");
  plan.secret_name = plan.secret_data.empty() ? "" : secret;
  plan.trainjob_json = v1alpha1::to_json(copy).dump();
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
