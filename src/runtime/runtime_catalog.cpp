// The runtime catalog (see runtime_catalog.h) and the SDK view of a runtime, computed as upstream's
// get_runtime_trainer() computes it: the trainer container of the job labelled as the trainer
// ancestor, its device from resource limits, the count times the node count.
#include "runtime/runtime_catalog.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "core/error.h"

namespace ktune {

namespace {

bool is_runtime_doc(const v1alpha1::Json& doc) {
  if (!doc.is_object() || !doc.contains("kind") || !doc["kind"].is_string()) return false;
  const std::string kind = doc["kind"].get<std::string>();
  return kind == v1alpha1::kClusterTrainingRuntimeKind || kind == v1alpha1::kTrainingRuntimeKind;
}

}  // namespace

bool container_devices(const v1alpha1::ResourceRequirements& r, std::string* device, std::string* count) {
  if (r.limits.empty()) return false;
  auto take = [&](const std::string& key, const std::string& name) {
    auto it = r.limits.find(key);
    if (it == r.limits.end()) return false;
    *device = name;
    *count = it->second;
    return true;
  };
  if (take("nvidia.com/gpu", "gpu") || take("google.com/tpu", "tpu")) return true;
  for (const auto& [k, v] : r.limits)
    if (k.rfind("nvidia.com/mig-", 0) == 0) {
      *device = k.substr(k.find('/') + 1);
      *count = v;
      return true;
    }
  if (take("huawei.com/Ascend910", "npu") || take("cpu", "cpu")) return true;
  return false;
}

namespace {

bool is_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

RuntimeCatalog RuntimeCatalog::builtin() {
  RuntimeCatalog c;
  for (const EmbeddedManifest& m : embedded_manifests()) c.add_yaml(m.text, std::string("manifests/") + m.path);
  return c;
}

RuntimeCatalog RuntimeCatalog::load_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(dir)) throw Error(dir, "not a directory of runtime manifests");
  std::vector<std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    const std::string ext = e.path().extension().string();
    if (ext != ".yaml" && ext != ".yml" && ext != ".json") continue;
    if (e.path().filename() == "kustomization.yaml" || e.path().filename() == "kustomization.yml") continue;
    files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  RuntimeCatalog c;
  for (const std::string& f : files) c.load_file(f);
  return c;
}

void RuntimeCatalog::add(v1alpha1::TrainingRuntime runtime) {
  for (v1alpha1::TrainingRuntime& r : runtimes_)
    if (r.metadata.name == runtime.metadata.name) {
      r = std::move(runtime);
      return;
    }
  runtimes_.push_back(std::move(runtime));
}

void RuntimeCatalog::add_yaml(const std::string& text, const std::string& where) {
  const std::vector<v1alpha1::Json> docs = v1alpha1::parse_yaml_documents(text, where);
  for (size_t i = 0; i < docs.size(); ++i)
    if (is_runtime_doc(docs[i]))
      add(v1alpha1::runtime_from_json(docs[i], docs.size() > 1 ? where + " (document " + std::to_string(i + 1) + ")" : where));
}

void RuntimeCatalog::load_file(const std::string& path) {
  const std::vector<v1alpha1::Json> docs = v1alpha1::load_yaml_file(path);
  for (size_t i = 0; i < docs.size(); ++i)
    if (is_runtime_doc(docs[i]))
      add(v1alpha1::runtime_from_json(docs[i], docs.size() > 1 ? path + " (document " + std::to_string(i + 1) + ")" : path));
}

const v1alpha1::TrainingRuntime* RuntimeCatalog::find(const std::string& name) const {
  for (const v1alpha1::TrainingRuntime& r : runtimes_)
    if (r.metadata.name == name) return &r;
  return nullptr;
}

const v1alpha1::TrainingRuntime& RuntimeCatalog::get(const std::string& name) const {
  if (const v1alpha1::TrainingRuntime* r = find(name)) return *r;
  std::string available;
  for (const std::string& n : names()) available += (available.empty() ? "" : ", ") + n;
  throw Error("runtime " + name, "not found; available: " + (available.empty() ? "none" : available));
}

std::vector<std::string> RuntimeCatalog::names() const {
  std::vector<std::string> out;
  for (const v1alpha1::TrainingRuntime& r : runtimes_) out.push_back(r.metadata.name);
  std::sort(out.begin(), out.end());
  return out;
}

types::Runtime to_sdk_runtime(const v1alpha1::TrainingRuntime& runtime) {
  types::Runtime rt;
  rt.name = runtime.metadata.name;
  rt.kind = runtime.kind == v1alpha1::kTrainingRuntimeKind ? types::RuntimeKind::TrainingRuntime
                                                           : types::RuntimeKind::ClusterTrainingRuntime;
  const std::string framework = runtime.framework();
  rt.trainer.framework = framework;
  rt.trainer.trainer_type = framework == "torchtune" ? types::TrainerType::BuiltinTrainer : types::TrainerType::CustomTrainer;
  const auto node = runtime.find_replicated_job("trainer");
  const v1alpha1::Container* c = node ? node->find_container("node") : nullptr;
  if (c == nullptr) throw Error("runtime " + runtime.metadata.name, "has no trainer container (a replicated job \"node\" with a container \"node\")");
  rt.trainer.image = c->image;
  std::string device, count;
  if (container_devices(c->resources, &device, &count)) {
    rt.trainer.device = device;
    rt.trainer.device_count = count;
  }
  // Upstream's get_runtime_trainer: the MPI plugin's numProcPerNode overrides the accelerator count.
  const auto& mpi = runtime.ml_policy.mpi;
  if (mpi.is_object() && mpi.contains("numProcPerNode") && mpi["numProcPerNode"].is_number_integer() &&
      mpi["numProcPerNode"].get<int64_t>() != 0)
    rt.trainer.device_count = std::to_string(mpi["numProcPerNode"].get<int64_t>());
  const int nodes = runtime.ml_policy.num_nodes.value_or(0);
  if (is_digits(rt.trainer.device_count) && nodes > 0)
    rt.trainer.device_count = std::to_string(std::stoll(rt.trainer.device_count) * nodes);
  if (nodes > 0) rt.trainer.num_nodes = nodes;
  if (framework == "torchtune")
    rt.trainer.command = {"tune", "run"};
  else if (runtime.ml_policy.torch)
    rt.trainer.command = {"torchrun"};
  else if (!runtime.ml_policy.mpi.is_null())
    rt.trainer.command = {"mpirun", "--hostfile", "/etc/mpi/hostfile", "python"};
  else
    rt.trainer.command = {"python"};
  // The pretrained model: the default STORAGE_URI of the runtime's model initializer.
  if (const auto mi = runtime.find_replicated_job("model-initializer")) {
    for (const v1alpha1::Container& mc : mi->containers)
      for (const v1alpha1::EnvVar& e : mc.env)
        if (e.name == "STORAGE_URI" && e.value) {
          std::string uri = *e.value;
          if (uri.rfind("hf://", 0) == 0) uri = uri.substr(5);
          rt.pretrained_model = uri;
        }
  }
  return rt;
}

std::vector<types::Runtime> list_runtimes(const RuntimeCatalog& catalog) {
  std::vector<types::Runtime> out;
  for (const std::string& name : catalog.names()) {
    const v1alpha1::TrainingRuntime& r = catalog.get(name);
    if (r.framework().empty()) continue;
    out.push_back(to_sdk_runtime(r));
  }
  return out;
}

}  // namespace ktune
