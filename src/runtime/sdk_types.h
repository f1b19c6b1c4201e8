// The SDK's types, as the upstream Python SDK (kubeflow.trainer.types) spells them: plain structs
// with the same snake_case field names, so that a Python face can mirror them one to one.
// `std::nullopt` plays Python's None. Enum values render as upstream's `.value` strings.
//
// It holds data only: turning these into a TrainJob is trainjob_builder.h, checking them is
// validation.h. A Python `func` (CustomTrainer) has no C++ equivalent: a CustomTrainer here runs a
// command, or a script whose text is embedded into the node command as upstream embeds a function.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace ktune::types {

// Python dicts keep insertion order, and upstream renders them in that order: so do we.
using StringDict = std::vector<std::pair<std::string, std::string>>;

inline constexpr const char* kUnknown = "Unknown";

// TrainJob statuses (the SDK derives Created and Running itself).
inline constexpr const char* kTrainJobCreated = "Created";
inline constexpr const char* kTrainJobRunning = "Running";
inline constexpr const char* kTrainJobComplete = "Complete";
inline constexpr const char* kTrainJobFailed = "Failed";

enum class TrainerType { CustomTrainer, BuiltinTrainer };
enum class Framework { Torch, DeepSpeed, MLX, TorchTune };
enum class RuntimeKind { ClusterTrainingRuntime, TrainingRuntime };
enum class Loss { CEWithChunkedOutputLoss };
enum class DataType { BF16, FP32 };
enum class DataFormat { JSON, CSV, PARQUET, ARROW, TEXT, XML };

// Upstream's `.value` of each enum ("CustomTrainer", "torchtune", "bf16", "parquet",
// "torchtune.modules.loss.CEWithChunkedOutputLoss", ...), and back (nullopt when unknown).
std::string to_string(TrainerType v);
std::string to_string(Framework v);
std::string to_string(RuntimeKind v);
std::string to_string(Loss v);
std::string to_string(DataType v);
std::string to_string(DataFormat v);
std::optional<Framework> framework_from_string(const std::string& s);
std::optional<Loss> loss_from_string(const std::string& s);
std::optional<DataType> data_type_from_string(const std::string& s);     // "bf16" | "fp32"
std::optional<DataFormat> data_format_from_string(const std::string& s); // "json" | "csv" | ...

struct LoraConfig {
  std::optional<bool> apply_lora_to_mlp;
  std::optional<bool> apply_lora_to_output;
  std::vector<std::string> lora_attn_modules{"q_proj", "v_proj", "output_proj"};
  std::optional<int> lora_rank;
  std::optional<int> lora_alpha;
  std::optional<double> lora_dropout;
  std::optional<bool> quantize_base;
  std::optional<bool> use_dora;
};

struct TorchTuneInstructDataset {
  std::optional<DataFormat> source;
  std::optional<std::string> split;
  std::optional<bool> train_on_input;
  std::optional<std::string> new_system_prompt;
  StringDict column_map;                          // empty: None
};

struct TorchTuneChatDataset {
  std::optional<DataFormat> source;
  std::optional<std::string> split;
  std::optional<std::string> conversation_column;
  std::optional<std::string> conversation_style;  // "sharegpt" | "openai"
  std::optional<bool> train_on_input;
  std::optional<std::string> new_system_prompt;
};

struct TorchTuneMultimodalDataset {
  std::optional<DataFormat> source;
  std::optional<std::string> split;
  StringDict column_map;
  std::optional<std::string> image_dir;
  std::optional<std::string> image_tag;
};

using DatasetPreprocessConfig =
    std::variant<std::monostate, TorchTuneInstructDataset, TorchTuneChatDataset, TorchTuneMultimodalDataset>;

struct TorchTuneConfig {
  std::optional<DataType> dtype;
  std::optional<int> batch_size;
  std::optional<int> epochs;
  std::optional<Loss> loss;
  std::optional<int> num_nodes;
  std::optional<LoraConfig> peft_config;
  DatasetPreprocessConfig dataset_preprocess_config;
  StringDict resources_per_node;                  // {"gpu": "1", "cpu": "4", "memory": "16Gi"}
};

struct BuiltinTrainer {
  TorchTuneConfig config;
};

// Either `command` (argv run on every node, with the PET_* env) or `script` (its text is written
// into the workspace and run with torchrun, as upstream runs a function), with `args` after it.
struct CustomTrainer {
  std::vector<std::string> command;
  std::string script;
  std::vector<std::string> args;
  StringDict env;
  std::vector<std::string> packages_to_install;
  std::vector<std::string> pip_index_urls{"https://pypi.org/simple"};
  std::optional<int> num_nodes;
  StringDict resources_per_node;
  std::optional<std::string> image;
};

// A container image that holds the whole training (upstream's CustomTrainerContainer): every node
// runs it, with the runtime's command unless JobOptions' trainer_command / trainer_args (upstream's
// TrainerCommand / TrainerArgs options) replace the command or its arguments. It needs a cluster to
// run images: the Kubernetes backend takes it, the local backend refuses it.
struct CustomTrainerContainer {
  std::string image;
  std::optional<int> num_nodes;
  StringDict resources_per_node;
  StringDict env;
};

using Trainer = std::variant<std::monostate, CustomTrainer, BuiltinTrainer, CustomTrainerContainer>;

// What upstream's train(options=[...]) sets that ktune takes: Name (every backend), Labels,
// Annotations, ActiveDeadlineSeconds (the TrainJob's metadata and spec), TrainerCommand and
// TrainerArgs (.spec.trainer.command / .args, with a CustomTrainerContainer or no trainer): the
// Kubernetes backend's only, as upstream; the local backend refuses them at submit, and plans them
// for `--dry-run`.
struct JobOptions {
  std::string name;                                     // "": a generated one
  std::map<std::string, std::string> labels;            // .metadata.labels
  std::map<std::string, std::string> annotations;       // .metadata.annotations
  std::optional<std::int64_t> active_deadline_seconds;  // .spec.activeDeadlineSeconds, at least 1
  std::optional<std::vector<std::string>> trainer_command;  // .spec.trainer.command
  std::optional<std::vector<std::string>> trainer_args;     // .spec.trainer.args
};

// ---- initializers ----------------------------------------------------------------------------

inline const std::vector<std::string>& default_model_ignore_patterns() {
  static const std::vector<std::string> patterns{"*.msgpack", "*.h5", "*.bin", "*.pt", "*.pth"};
  return patterns;
}

struct HuggingFaceDatasetInitializer {
  std::string storage_uri;                        // "hf://org/repo[/path]" or "org/repo[/path]"
  std::optional<std::vector<std::string>> ignore_patterns;
  std::optional<std::string> access_token;
};

struct S3DatasetInitializer {
  std::string storage_uri;                        // "s3://bucket/path"
  std::optional<std::vector<std::string>> ignore_patterns;
  std::optional<std::string> endpoint;
  std::optional<std::string> access_key_id;
  std::optional<std::string> secret_access_key;
  std::optional<std::string> region;
  std::optional<std::string> role_arn;
};

struct HuggingFaceModelInitializer {
  std::string storage_uri;
  std::optional<std::vector<std::string>> ignore_patterns = default_model_ignore_patterns();
  std::optional<std::string> access_token;
};

struct S3ModelInitializer {
  std::string storage_uri;
  std::optional<std::vector<std::string>> ignore_patterns = default_model_ignore_patterns();
  std::optional<std::string> endpoint;
  std::optional<std::string> access_key_id;
  std::optional<std::string> secret_access_key;
  std::optional<std::string> region;
  std::optional<std::string> role_arn;
};

// Upstream's distributed data cache: an Iceberg table (`metadata_loc`) served by `num_data_nodes`
// cache nodes and a head, which a CustomTrainer's function reads. Only a cluster runtime that runs
// the cache (upstream's torch-distributed-with-cache) can serve it: the TrainJob carries it, the
// local backend refuses it.
struct DataCacheInitializer {
  std::string storage_uri;  // "cache://<schema>/<table>"
  std::string metadata_loc;
  int num_data_nodes = 0;   // more than 1
  std::optional<std::string> head_cpu;
  std::optional<std::string> head_mem;
  std::optional<std::string> worker_cpu;
  std::optional<std::string> worker_mem;
  std::optional<std::string> iam_role;
};

using DatasetInitializer =
    std::variant<std::monostate, HuggingFaceDatasetInitializer, S3DatasetInitializer, DataCacheInitializer>;
using ModelInitializer = std::variant<std::monostate, HuggingFaceModelInitializer, S3ModelInitializer>;

struct Initializer {
  DatasetInitializer dataset;
  ModelInitializer model;
};

// ---- runtimes and jobs, as the SDK shows them ---------------------------------------------------

struct RuntimeTrainer {
  TrainerType trainer_type = TrainerType::CustomTrainer;
  std::string framework;                          // the framework label: "torchtune", "torch", ...
  std::string image;
  int num_nodes = 1;
  std::string device = kUnknown;                  // "gpu", "cpu", ...
  std::string device_count = kUnknown;            // over all nodes, as upstream counts it
  std::vector<std::string> command;               // the entrypoint: {"tune", "run"} for torchtune
};

struct Runtime {
  std::string name;
  RuntimeTrainer trainer;
  RuntimeKind kind = RuntimeKind::ClusterTrainingRuntime;
  std::optional<std::string> pretrained_model;    // e.g. "meta-llama/Llama-3.2-1B-Instruct"
};

struct Step {
  std::string name;                               // "dataset-initializer", "model-initializer", "node-0", ...
  std::optional<std::string> status;
  std::string pod_name;
  std::string device = kUnknown;
  std::string device_count = kUnknown;
};

// Progress the trainer reports (ktune's addition; upstream has no such signal).
struct TrainJobProgress {
  std::optional<int> progress_percentage;
  std::optional<std::int64_t> estimated_remaining_seconds;
  StringDict metrics;                             // {"loss": "2.31", "tokens_per_second": "812", ...}
};

// A cluster event about a TrainJob or its JobSet, Jobs and pods (upstream's types.Event).
struct Event {
  std::string involved_object_kind;               // "TrainJob", "JobSet", "Job", "Pod"
  std::string involved_object_name;
  std::string message;
  std::string reason;
  std::string event_time;                         // RFC 3339: the event's firstTimestamp
};

struct TrainJob {
  std::string name;
  Runtime runtime;
  std::vector<Step> steps;
  int num_nodes = 1;
  std::string creation_timestamp;                 // RFC 3339
  std::string status = kUnknown;                  // Created | Running | Complete | Failed
  TrainJobProgress progress;
};

}  // namespace ktune::types
