// The plugin registry (fixed order), RuntimeInfo's helpers, and the two small plugins that hold
// no framework knowledge: TrainerKind (which trainer goes on which runtime) and JobSet (one plan
// step per node). The framework plugins live in plugins/.
#include "runtime/plugins.h"

#include <cmath>
#include <regex>

namespace ktune {

bool RuntimeInfo::torchtune_entrypoint() const {
  return trainer.command.size() == 2 && trainer.command[0] == "tune" && trainer.command[1] == "run";
}

void RuntimeInfo::upsert_env(const std::string& name, const std::string& value) {
  for (auto& [k, v] : node_env)
    if (k == name) {
      v = value;
      return;
    }
  node_env.emplace_back(name, value);
}

std::optional<double> parse_quantity(const std::string& q) {
  static const std::regex re("^([+-]?([0-9]+(\\.[0-9]*)?|\\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|[eE][+-]?[0-9]+)?$");
  std::smatch m;
  if (!std::regex_match(q, m, re)) return std::nullopt;
  double v = std::stod(m[1].str());
  const std::string s = m[4].str();
  if (s.empty()) return v;
  if (s[0] == 'e' || s[0] == 'E') return v * std::pow(10.0, std::stoi(s.substr(1)));
  static const std::vector<std::pair<std::string, double>> suffixes{
      {"n", 1e-9}, {"u", 1e-6}, {"m", 1e-3}, {"k", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}, {"P", 1e15},
      {"E", 1e18}, {"Ki", 1024.0}, {"Mi", 1048576.0}, {"Gi", 1073741824.0}, {"Ti", 1099511627776.0},
      {"Pi", 1125899906842624.0}, {"Ei", 1152921504606846976.0}};
  for (const auto& [name, scale] : suffixes)
    if (name == s) return v * scale;
  return std::nullopt;
}

RuntimeInfo make_runtime_info(const v1alpha1::TrainJob& job, const v1alpha1::TrainingRuntime& runtime,
                              const ConfigSet& configs) {
  RuntimeInfo info;
  info.job = &job;
  info.runtime = &runtime;
  info.configs = &configs;
  if (job.spec.trainer) info.trainer = *job.spec.trainer;
  info.node_job = runtime.find_replicated_job("trainer");
  if (info.node_job)
    if (const v1alpha1::Container* c = info.node_job->find_container("node")) info.node = *c;
  info.num_nodes = info.trainer.num_nodes.value_or(runtime.ml_policy.num_nodes.value_or(1));
  info.image = info.trainer.image.value_or(info.node.image);
  // The container's own command and args, unless the job overrides them (Kubernetes semantics:
  // a TrainJob command replaces the command, its args replace the args).
  const std::vector<std::string>& command = info.trainer.command.empty() ? info.node.command : info.trainer.command;
  const std::vector<std::string>& args = info.trainer.args.empty() ? info.node.args : info.trainer.args;
  info.node_command = command;
  info.node_command.insert(info.node_command.end(), args.begin(), args.end());
  for (const v1alpha1::EnvVar& e : info.node.env)
    if (e.value) info.node_env.emplace_back(e.name, *e.value);
  for (const v1alpha1::EnvVar& e : info.trainer.env)
    if (e.value) info.upsert_env(e.name, *e.value);
  return info;
}

std::vector<Error> run_plugin_validation(RuntimeInfo& info) {
  for (const auto& p : plugins()) p->enforce_ml_policy(info);
  std::vector<Error> errors = info.errors;
  for (const auto& p : plugins()) p->validate(info, errors);
  return errors;
}

namespace {

class TrainerKindPlugin : public Plugin {
 public:
  const char* name() const override { return "TrainerKind"; }

  void validate(const RuntimeInfo& info, std::vector<Error>& errors) const override {
    const std::string runtime = info.runtime->metadata.name;
    if (info.node.name.empty()) {
      errors.emplace_back("spec.runtimeRef.name",
                          "runtime " + runtime + " has no trainer: a replicated job \"node\" (or one labelled " +
                              v1alpha1::kAncestorLabel + ": trainer) with a container \"node\"");
      return;
    }
    // A job's own image with no command runs the image's entrypoint (Kubernetes semantics): a
    // CustomTrainerContainer's way.
    if (info.node_command.empty() && !info.trainer.image)
      errors.emplace_back("spec.trainer.command", "runtime " + runtime +
                                                      " gives the node no command, so the job must: a CustomTrainer "
                                                      "with a command or a script, or a CustomTrainerContainer");
    const bool torchtune_runtime = info.runtime->framework() == "torchtune";
    if (torchtune_runtime && !info.trainer.command.empty() && !info.torchtune_entrypoint())
      errors.emplace_back("spec.trainer.command",
                          "a CustomTrainer (command " + info.trainer.command[0] + " ...) cannot run on runtime " + runtime +
                              ", a BuiltinTrainer (torchtune) runtime; use a BuiltinTrainer, or a runtime "
                              "such as torch-distributed");
    if (!torchtune_runtime && info.torchtune_entrypoint())
      errors.emplace_back("spec.trainer.command",
                          "a BuiltinTrainer (tune run) needs a runtime labelled " + std::string(v1alpha1::kFrameworkLabel) +
                              ": torchtune; runtime " + runtime + " is " +
                              (info.runtime->framework().empty() ? "unlabelled" : info.runtime->framework()) +
                              " (a CustomTrainer runtime)");
  }
};

class JobSetPlugin : public Plugin {
 public:
  const char* name() const override { return "JobSet"; }

  void build_steps(const RuntimeInfo& info, TrainJobPlan& plan) const override {
    // Dependencies: the node job's dependsOn, kept where the step exists in the plan.
    std::vector<std::string> depends;
    if (info.node_job)
      for (const v1alpha1::DependsOn& d : info.node_job->depends_on)
        for (const PlanStep& s : plan.steps)
          if (s.name == d.name) depends.push_back(d.name);
    for (int rank = 0; rank < info.num_nodes; ++rank) {
      PlanStep s;
      s.name = "node-" + std::to_string(rank);
      s.replicated_job = info.node_job ? info.node_job->name : "node";
      s.image = info.image;
      s.command = info.node_command;
      for (const auto& [k, v] : info.node_env) s.env[k] = v;
      if (!info.node_rank_env.empty()) s.env[info.node_rank_env] = std::to_string(rank);
      s.working_dir = plan.workspace;
      s.depends_on = depends;
      s.node_rank = rank;
      s.num_proc = info.num_proc_per_node;
      s.device = info.device;
      s.device_count = std::to_string(info.num_proc_per_node);
      s.container_port = info.container_port;
      plan.steps.push_back(std::move(s));
    }
  }
};

}  // namespace

std::unique_ptr<Plugin> make_trainer_kind_plugin() { return std::make_unique<TrainerKindPlugin>(); }
std::unique_ptr<Plugin> make_jobset_plugin() { return std::make_unique<JobSetPlugin>(); }

const std::vector<std::unique_ptr<Plugin>>& plugins() {
  static const std::vector<std::unique_ptr<Plugin>> all = [] {
    std::vector<std::unique_ptr<Plugin>> v;
    v.push_back(make_trainer_kind_plugin());
    v.push_back(make_torch_plugin());
    v.push_back(make_torchtune_plugin());
    v.push_back(make_initializer_plugin());
    v.push_back(make_jobset_plugin());
    return v;
  }();
  return all;
}

}  // namespace ktune
