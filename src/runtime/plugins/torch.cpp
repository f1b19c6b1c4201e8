// The torch ML policy (upstream's Torch plugin): how many nodes, how many processes per node
// (`auto` -> the node's GPUs, else its CPUs), the PET_* env torchrun reads, and port 29500 for the
// rendezvous. It refuses user env that would fight it. It knows nothing of torchtune's recipes.
#include <cmath>
#include <set>

#include "runtime/plugins.h"

namespace ktune {

namespace {

const std::set<std::string>& reserved_env() {
  static const std::set<std::string> names{"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR",
                                           "PET_MASTER_PORT"};
  return names;
}

bool is_positive_integer(const std::string& s) {
  if (s.empty() || s.size() > 9) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return std::stoi(s) >= 1;
}

// A resource count as Kubernetes' Quantity.Value() gives it (rounded up); -1 when malformed.
long long count_of(const std::string& q) {
  const auto v = parse_quantity(q);
  if (!v || *v < 0) return -1;
  return static_cast<long long>(std::ceil(*v - 1e-9));
}

// The first resource whose name contains "gpu": requests before limits.
std::optional<std::pair<std::string, std::string>> gpu_resource(const v1alpha1::ResourceRequirements& r) {
  for (const auto* list : {&r.requests, &r.limits})
    for (const auto& [k, v] : *list) {
      std::string lower = k;
      for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (lower.find("gpu") != std::string::npos) return std::make_pair(k, v);
    }
  return std::nullopt;
}

std::optional<std::string> cpu_resource(const v1alpha1::ResourceRequirements& r) {
  auto it = r.requests.find("cpu");
  if (it != r.requests.end() && count_of(it->second) > 0) return it->second;
  it = r.limits.find("cpu");
  if (it != r.limits.end()) return it->second;
  return std::nullopt;
}

class TorchPlugin : public Plugin {
 public:
  const char* name() const override { return "Torch"; }

  void enforce_ml_policy(RuntimeInfo& info) const override {
    if (!info.runtime->ml_policy.torch) return;
    const v1alpha1::TorchPolicy& torch = *info.runtime->ml_policy.torch;
    if (!info.trainer.num_proc_per_node.empty())
      info.num_proc_policy = info.trainer.num_proc_per_node;
    else if (!torch.num_proc_per_node.empty())
      info.num_proc_policy = torch.num_proc_per_node;
    info.resources = info.trainer.resources_per_node ? *info.trainer.resources_per_node : info.node.resources;
    const std::string path = info.trainer.resources_per_node ? "spec.trainer.resourcesPerNode"
                                                             : "runtime " + info.runtime->metadata.name + " node resources";

    const auto gpu = gpu_resource(info.resources);
    long long gpus = 0;
    if (gpu) {
      gpus = count_of(gpu->second);
      if (gpus < 0) {
        info.errors.emplace_back(path + "." + gpu->first, "is not a quantity: " + gpu->second);
        gpus = 0;
      }
      const size_t slash = gpu->first.find('/');
      info.device = slash == std::string::npos ? gpu->first : gpu->first.substr(slash + 1);
    }
    long long cpus = 0;
    if (const auto cpu = cpu_resource(info.resources)) {
      cpus = count_of(*cpu);
      if (cpus < 0) {
        info.errors.emplace_back(path + ".cpu", "is not a quantity: " + *cpu);
        cpus = 0;
      }
    }
    const std::string& p = info.num_proc_policy;
    if (p == "auto") {
      info.num_proc_per_node = static_cast<int>(gpu && gpus > 0 ? gpus : std::max(1LL, cpus));
      if (!(gpu && gpus > 0)) info.device = "cpu";
    } else if (p == "cpu") {
      info.num_proc_per_node = static_cast<int>(std::max(1LL, cpus));
      info.device = "cpu";
    } else if (p == "gpu") {
      if (gpus < 1)
        info.errors.emplace_back("spec.trainer.numProcPerNode", "is gpu, but the node resources name no GPU");
      info.num_proc_per_node = static_cast<int>(std::max(1LL, gpus));
    } else if (is_positive_integer(p)) {
      info.num_proc_per_node = std::stoi(p);
      if (!(gpu && gpus > 0)) info.device = "cpu";
    } else {
      info.errors.emplace_back("spec.trainer.numProcPerNode",
                               "must be a positive integer or one of auto, cpu, gpu; got " + p);
    }
    if (info.num_nodes < 1)
      info.errors.emplace_back("spec.trainer.numNodes", "must be at least 1; got " + std::to_string(info.num_nodes));
  }

  void validate(const RuntimeInfo& info, std::vector<Error>& errors) const override {
    if (!info.runtime->ml_policy.torch) return;
    std::string found;
    for (size_t i = 0; i < info.trainer.env.size(); ++i) {
      const std::string& name = info.trainer.env[i].name;
      if (reserved_env().count(name))
        errors.emplace_back("spec.trainer.env[" + std::to_string(i) + "].name",
                            "must not set reserved env " + name +
                                " (the torch policy sets PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, "
                                "PET_MASTER_ADDR, PET_MASTER_PORT)");
    }
  }

  void mutate(RuntimeInfo& info) const override {
    if (!info.runtime->ml_policy.torch) return;
    info.upsert_env("PET_NNODES", std::to_string(info.num_nodes));
    info.upsert_env("PET_NPROC_PER_NODE", std::to_string(info.num_proc_per_node));
    info.node_rank_env = "PET_NODE_RANK";
    if (!info.torchtune_entrypoint()) {
      const std::string job = info.job->metadata.name;
      info.upsert_env("PET_MASTER_ADDR", job + "-node-0-0." + job);
      info.upsert_env("PET_MASTER_PORT", std::to_string(kTrainerPort));
    }
    info.container_port = kTrainerPort;
  }
};

}  // namespace

std::unique_ptr<Plugin> make_torch_plugin() { return std::make_unique<TorchPlugin>(); }

}  // namespace ktune
