// The initializer steps: the runtime's dataset-initializer and model-initializer jobs, with the
// TrainJob's spec.initializer merged over them (storageUri -> STORAGE_URI, env upserted). Each
// downloads into the shared workspace (/workspace/dataset, /workspace/model); its command is the
// runtime container's, else `ktune initializer dataset|model` (the hub layer implements it).
// Secret env (ACCESS_TOKEN, SECRET_ACCESS_KEY, ...) goes to PlanStep::secret_env, never printed.
//
// A runtime initializer with no STORAGE_URI (neither a default nor the job's) has nothing to
// download: it is left out of the plan, and the node no longer waits for it.
#include "runtime/plugins.h"
#include "runtime/trainjob_builder.h"

namespace ktune {

namespace {

struct Kind {
  const char* job;        // replicated job and container name
  const char* argument;   // `ktune initializer <argument>`
  const char* field;      // spec.initializer.<field>
};
const Kind kKinds[] = {{"dataset-initializer", "dataset", "dataset"}, {"model-initializer", "model", "model"}};

const std::optional<v1alpha1::InitializerSpec>& spec_of(const RuntimeInfo& info, const Kind& k) {
  static const std::optional<v1alpha1::InitializerSpec> none;
  if (!info.job->spec.initializer) return none;
  return std::string(k.field) == "dataset" ? info.job->spec.initializer->dataset : info.job->spec.initializer->model;
}

class InitializerPlugin : public Plugin {
 public:
  const char* name() const override { return "Initializer"; }

  void validate(const RuntimeInfo& info, std::vector<Error>& errors) const override {
    for (const Kind& k : kKinds) {
      const auto& spec = spec_of(info, k);
      if (!spec) continue;
      const std::string path = std::string("spec.initializer.") + k.field;
      if (!info.runtime->find_replicated_job(k.job))
        errors.emplace_back(path, "runtime " + info.runtime->metadata.name + " has no " + k.job + " job to run it");
      if (spec->storage_uri) {
        const std::string& uri = *spec->storage_uri;
        const bool data_cache = std::string(k.field) == "dataset" && uri.rfind("cache://", 0) == 0;
        if (data_cache && info.runtime->framework() == "torchtune")
          errors.emplace_back(path + ".storageUri",
                              "a data cache (cache://) feeds a CustomTrainer's function, which reads it; runtime " +
                                  info.runtime->metadata.name + "'s torchtune trainer reads files: give it an hf://, s3:// or file:// dataset");
        else if (!data_cache && uri.rfind("hf://", 0) != 0 && uri.rfind("s3://", 0) != 0 && uri.rfind("file://", 0) != 0)
          errors.emplace_back(path + ".storageUri", "must start with hf://, s3:// or file://" +
                                                        std::string(std::string(k.field) == "dataset" ? " (or cache:// for a data cache)" : "") +
                                                        "; got \"" + uri + "\"");
        else if (uri.rfind("hf://", 0) == 0 && uri.find('/', 5) == std::string::npos)
          errors.emplace_back(path + ".storageUri", "must name a repository, hf://<org>/<repo>[/path]; got \"" + uri + "\"");
      }
    }
  }

  void build_steps(const RuntimeInfo& info, TrainJobPlan& plan) const override {
    for (const Kind& k : kKinds) {
      const auto rjob = info.runtime->find_replicated_job(k.job);
      if (!rjob) continue;
      const v1alpha1::Container* c = rjob->find_container(k.job);
      if (c == nullptr && !rjob->containers.empty()) c = &rjob->containers.front();
      std::vector<std::pair<std::string, std::string>> env;
      auto upsert = [&](const std::string& name, const std::string& value) {
        for (auto& [n, v] : env)
          if (n == name) {
            v = value;
            return;
          }
        env.emplace_back(name, value);
      };
      if (c)
        for (const v1alpha1::EnvVar& e : c->env)
          if (e.value) upsert(e.name, *e.value);
      if (const auto& spec = spec_of(info, k)) {
        if (spec->storage_uri && !spec->storage_uri->empty()) upsert("STORAGE_URI", *spec->storage_uri);
        for (const v1alpha1::EnvVar& e : spec->env)
          if (e.value) upsert(e.name, *e.value);
      }
      bool has_uri = false;
      for (const auto& [n, v] : env) has_uri |= n == "STORAGE_URI" && !v.empty();
      if (!has_uri) continue;

      PlanStep s;
      s.name = k.job;
      s.replicated_job = rjob->name;
      s.image = c ? c->image : "";
      if (c && (!c->command.empty() || !c->args.empty())) {
        s.command = c->command;
        s.command.insert(s.command.end(), c->args.begin(), c->args.end());
      } else {
        s.command = {"ktune", "initializer", k.argument};
      }
      for (const auto& [n, v] : env) (is_secret_env_name(n) ? s.secret_env : s.env)[n] = v;
      s.working_dir = plan.workspace;
      for (const v1alpha1::DependsOn& d : rjob->depends_on)
        for (const PlanStep& prior : plan.steps)
          if (prior.name == d.name) s.depends_on.push_back(d.name);
      s.node_rank = -1;
      s.num_proc = 1;
      s.device = "cpu";
      s.device_count = "1";
      plan.steps.push_back(std::move(s));
    }
  }
};

}  // namespace

std::unique_ptr<Plugin> make_initializer_plugin() { return std::make_unique<InitializerPlugin>(); }

}  // namespace ktune
