// The dataset-initializer and model-initializer steps of a plan, with upstream Kubeflow
// Trainer's env contract: STORAGE_URI (hf://, s3://, file://), ACCESS_TOKEN, IGNORE_PATTERNS
// (comma-separated), S3 credentials from AWS_* variables; the files land in /workspace/dataset
// or /workspace/model (or $KTUNE_WORKSPACE/…, or an explicit folder). A dataset is fetched whole
// (or the subpath of the URI); a model only its `*.json *.safetensors *.model *.txt` files.
// It deliberately does not read Kubernetes objects or secrets: the controller has already put
// everything into the environment.
#pragma once

#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "hub/env_lookup.h"
#include "hub/storage.h"

namespace ktune::hub {

enum class InitializerKind { Dataset, Model };
InitializerKind parse_initializer_kind(const std::string& text);  // "dataset" | "model"
const char* initializer_kind_name(InitializerKind kind);

struct InitializerConfig {
  InitializerKind kind = InitializerKind::Model;
  std::string storage_uri;
  std::string output_dir;
  std::vector<std::string> allow_patterns;  // empty: the kind's default (model: the four above)
  std::vector<std::string> ignore_patterns;
  StorageOptions storage;                   // token, endpoint, S3 settings, retries
};


// Reads STORAGE_URI, ACCESS_TOKEN (else HF_TOKEN), IGNORE_PATTERNS, HF_ENDPOINT, the AWS_*
// variables and KTUNE_WORKSPACE. Flags given afterwards override these fields.
InitializerConfig initializer_config_from_env(InitializerKind kind, const EnvLookup& env = &std::getenv);

// Validates (STORAGE_URI set, …) and runs the download. Errors name the env variable at fault.
TransferReport run_initializer(const InitializerConfig& config, const ProgressFn& progress = nullptr);

}  // namespace ktune::hub
