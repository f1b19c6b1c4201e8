// From the SDK's call to the TrainJob object: what upstream's TrainerClient.train() builds before it
// submits — the trainer args of a TorchTuneConfig (spelled exactly as the upstream SDK spells them;
// tests compare with the real SDK), the initializer env, the CustomTrainer command, and a job name.
//
// It does not check the result (validation.h) nor decide recipes (the torchtune plugin does).
#pragma once

#include <string>
#include <vector>

#include "runtime/sdk_types.h"
#include "runtime/v1alpha1.h"

namespace ktune {

inline constexpr const char* kWorkspacePath = "/workspace";
inline constexpr const char* kDatasetPath = "/workspace/dataset";
inline constexpr const char* kModelPath = "/workspace/model";

// TorchTuneConfig -> trainer args, in upstream's order and spelling: dtype, batch_size, epochs,
// loss, the dataset location from a Hugging Face dataset URI, the LoRA fields, then the dataset
// preprocessing. ktune additions, each one of upstream's listed weaknesses fixed (off when
// `upstream_exact`): an S3 dataset gets `dataset.data_dir=/workspace/dataset` (upstream renders no
// location and trains on the config's default dataset); a file:// dataset points where its
// initializer copies it (a folder: `dataset.data_dir=/workspace/dataset`; a file, i.e. a last
// component with a dot: `dataset.data_files=/workspace/dataset/<name>`); chat and multimodal
// datasets render their fields (upstream refuses them).
std::vector<std::string> torchtune_args(const types::TorchTuneConfig& config, const types::Initializer* initializer,
                                        bool upstream_exact = false);

// A TorchTuneConfig's numbers within what the trainer's config schema takes, every problem at once
// (Errors, each named trainer.config.<field>): batch_size, epochs, num_nodes, LoRA's rank and alpha
// at least 1, its dropout in [0, 1).
// make_trainjob checks before it renders, since the rendering drops a 0 as upstream's does (`if
// config.epochs:`): epochs=0 would otherwise train the config's default number of epochs.
void check_torchtune_config(const types::TorchTuneConfig& config);

// resources_per_node {"gpu": 2, "cpu": 4, "memory": "16Gi"} -> ResourceRequirements, aliases as
// upstream: gpu -> nvidia.com/gpu, storage -> ephemeral-storage, mig-<p> -> nvidia.com/mig-<p>;
// requests = limits. Throws Error on GPU and MIG together or two MIG kinds.
v1alpha1::ResourceRequirements resources_per_node(const types::StringDict& resources);

// Initializer -> spec.initializer: storageUri, and the optional fields as env (upper-cased names,
// lists comma-joined: IGNORE_PATTERNS, ACCESS_TOKEN, ENDPOINT, ACCESS_KEY_ID, ...); a data cache's
// CLUSTER_SIZE and METADATA_LOC first, as upstream. Throws Errors for a data cache upstream refuses.
v1alpha1::Initializer trainjob_initializer(const types::Initializer& initializer);

// The TrainJob a train(runtime, initializer, trainer, options) call creates: options.name empty, a
// generated one; its labels, annotations and deadline as given (validation checks them); the
// options' trainer command and args over a CustomTrainerContainer's (or no trainer's) trainer, as
// upstream's TrainerCommand / TrainerArgs, which refuse the other trainers. The runtime must be the
// catalog's (its entrypoint decides the trainer command).
v1alpha1::TrainJob make_trainjob(const types::Runtime& runtime, const types::Initializer* initializer,
                                 const types::Trainer& trainer, const types::JobOptions& options = {});

// What of a train() call only a cluster can run, by upstream's names: a DataCacheInitializer (cache
// nodes to start), a CustomTrainerContainer (an image to run), the TrainerCommand and TrainerArgs
// options. The plan carries them so that the local backend refuses them at submit (and `--dry-run`
// still renders the TrainJob).
std::vector<std::string> kubernetes_only_parts(const types::Initializer* initializer, const types::Trainer& trainer,
                                               const types::JobOptions& options);

// The bash lines a CustomTrainer's function runs first to install packages_to_install: for the
// user, else system-wide; when both fail, pip's log on stderr and exit 1 (see the .cpp).
std::string pip_install_script(const std::vector<std::string>& packages, const std::vector<std::string>& index_urls);

// A letter + 11 hex characters, as upstream: "a1b2c3d4e5f6" shapes (12 characters).
std::string generate_job_name();

// Secret initializer env names: their values go to PlanStep::secret_env and are never printed.
bool is_secret_env_name(const std::string& name);  // ACCESS_TOKEN, SECRET_ACCESS_KEY, ...

}  // namespace ktune
