// TrainJobPlan: what the control plane decides a TrainJob runs, as an ordered list of steps.
// The same plan drives every backend: the local backend runs the steps as processes in a per-job
// workspace, the Kubernetes backend renders them into a TrainJob. Built by runtime/ (plugins,
// validation); executed by sdk/ backends. It knows nothing of the engine.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace ktune {

struct PlanStep {
  std::string name;                      // "dataset-initializer", "model-initializer", "node-0", "node-1", ...
  std::string image;                     // container image (Kubernetes); informational for local runs
  std::vector<std::string> command;      // argv[0..]: e.g. {"tune", "run", "--rdzv_endpoint=...", ...}
  std::map<std::string, std::string> env;  // PET_*, STORAGE_URI, ... (secrets stay in secret_env)
  std::map<std::string, std::string> secret_env;  // ACCESS_TOKEN etc.: passed to the process, never printed or stored
  std::string working_dir;               // "/workspace" in the container; the job workspace locally
  std::vector<std::string> depends_on;   // names of steps that must be Complete first
  int node_rank = -1;                    // node steps: 0..num_nodes-1; initializers: -1
  int num_proc = 1;                      // processes this step starts (nproc_per_node for nodes)
  // Added by the control plane (fields above are the shared contract and keep their names):
  std::string replicated_job;            // the JobSet replicatedJob it comes from: "node", "dataset-initializer", ...
  std::string device = "Unknown";        // as the SDK's Step shows it: "gpu", "cpu", ...
  std::string device_count = "Unknown";  // per step (node: processes of the node)
  int container_port = 0;                // 29500 on torch nodes (rendezvous), else 0
};

struct TrainJobPlan {
  std::string job_name;
  std::string runtime_name;
  std::string trainer_type;              // "BuiltinTrainer" | "CustomTrainer"
  int num_nodes = 1;
  int num_proc_per_node = 1;
  std::string recipe;                    // for torchtune runtimes: e.g. "lora_finetune_single_device"
  std::string config;                    // e.g. "llama3_2/1B_lora_single_device"
  std::vector<PlanStep> steps;           // in dependency order
  std::string model_key;                 // torchtune runtimes: "llama3_2/1B"; else ""
  std::string framework;                 // the runtime's framework label: "torchtune", "torch", ...

  std::string workspace = "/workspace";  // the shared volume's mount path, as the steps' paths spell it
  // What of the call needs a cluster (kubernetes_only_parts in trainjob_builder.h), which the local
  // backend refuses at submit: "DataCacheInitializer", "CustomTrainerContainer", "TrainerCommand", "TrainerArgs".
  std::vector<std::string> kubernetes_only;

  // The TrainJob object itself (trainer.kubeflow.org/v1alpha1 JSON), what a Kubernetes backend
  // creates and `ktune train --dry-run --backend kubernetes` prints. It holds no secret value: an
  // env var with a secret name (ACCESS_TOKEN, SECRET_ACCESS_KEY, *_TOKEN, ...) reads its value
  // from the Secret `secret_name` (valueFrom.secretKeyRef), whose data is `secret_data`.
  std::string trainjob_json;
  std::string secret_name;                          // "<job>-ktune-secrets"; "" when no secret
  std::map<std::string, std::string> secret_data;   // Secret key -> value: never printed or stored

  // Human-readable, as `ktune train --dry-run` prints it (secret_env values shown as ***).
  std::string to_text() const;
  // A copy whose paths under `workspace` (in commands, env values and working dirs) point into
  // `dir` instead: the local backend's per-job workspace plays /workspace.
  TrainJobPlan with_workspace(const std::string& dir) const;
};

}  // namespace ktune
