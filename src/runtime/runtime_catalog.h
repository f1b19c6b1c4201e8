// The runtime catalog: the ClusterTrainingRuntimes and TrainingRuntimes a TrainJob may name. The
// ones in manifests/ are compiled into the binary (builtin()); more can be loaded from a directory
// or a file, and a later runtime of the same name replaces an earlier one.
//
// It also gives the SDK's view of a runtime (types::Runtime: trainer type, framework, device,
// count, pretrained model), computed as upstream's SDK computes it. It does not validate TrainJobs.
#pragma once

#include <string>
#include <vector>

#include "runtime/recipe_table.h"
#include "runtime/sdk_types.h"
#include "runtime/v1alpha1.h"

namespace ktune {

class RuntimeCatalog {
 public:
  RuntimeCatalog() = default;

  // The runtimes of manifests/ (embedded at build time).
  static RuntimeCatalog builtin();
  // Every ClusterTrainingRuntime / TrainingRuntime document in *.yaml / *.yml / *.json files under
  // `dir` (recursively; kustomization.yaml and other kinds are skipped).
  static RuntimeCatalog load_dir(const std::string& dir);

  void add(v1alpha1::TrainingRuntime runtime);           // replaces one of the same name
  void add_yaml(const std::string& text, const std::string& where);
  void load_file(const std::string& path);

  const v1alpha1::TrainingRuntime* find(const std::string& name) const;
  // Throws Error("runtime NAME", "not found; available: a, b, ...").
  const v1alpha1::TrainingRuntime& get(const std::string& name) const;
  std::vector<std::string> names() const;                // sorted
  const std::vector<v1alpha1::TrainingRuntime>& runtimes() const { return runtimes_; }
  bool empty() const { return runtimes_.empty(); }

  // The configs the runtimes' trainer image ships, which validation checks a job's config against:
  // ktune's bundled configs by default (ConfigSet::torchtune() where the build had none).
  const ConfigSet& configs() const { return configs_; }
  void set_configs(const ConfigSet& configs) { configs_ = configs; }

 private:
  std::vector<v1alpha1::TrainingRuntime> runtimes_;
  ConfigSet configs_ = ConfigSet::bundled().empty() ? ConfigSet::torchtune() : ConfigSet::bundled();
};

// Upstream's get_container_devices: the first of GPU, TPU, MIG, NPU, CPU in the limits, as
// ("gpu", "2"); false when the limits name none.
bool container_devices(const v1alpha1::ResourceRequirements& r, std::string* device, std::string* count);

// The SDK view of a runtime, as upstream's get_runtime() builds it.
types::Runtime to_sdk_runtime(const v1alpha1::TrainingRuntime& runtime);
// list_runtimes(): runtimes without the framework label are skipped (as upstream does); sorted by name.
std::vector<types::Runtime> list_runtimes(const RuntimeCatalog& catalog);

// The name of the embedded manifest files, and their text (for `ktune runtimes --export`).
struct EmbeddedManifest {
  const char* path;   // relative to manifests/, e.g. "runtimes/torchtune/llama3_2/llama3_2_1B.yaml"
  const char* text;
};
const std::vector<EmbeddedManifest>& embedded_manifests();

}  // namespace ktune
