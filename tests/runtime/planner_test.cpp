// Plans: the steps, commands and env a TrainJob gets on the built-in runtimes (the torch policy,
// the torchtune mutation, the initializers), the dry-run text, the TrainJob YAML, re-rooting.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/error.h"
#include "runtime/planner.h"
#include "runtime/runtime_catalog.h"
#include "runtime/trainjob_builder.h"

namespace ktune {
namespace {

const RuntimeCatalog& catalog() {
  static const RuntimeCatalog c = RuntimeCatalog::builtin();
  return c;
}

v1alpha1::TrainJob tune_job(const std::string& runtime, std::vector<std::string> args = {}) {
  v1alpha1::TrainJob j;
  j.metadata.name = "job-1";
  j.spec.runtime_ref.name = runtime;
  v1alpha1::Trainer t;
  t.command = {"tune", "run"};
  t.args = std::move(args);
  j.spec.trainer = t;
  return j;
}

const PlanStep& step(const TrainJobPlan& p, const std::string& name) {
  for (const PlanStep& s : p.steps)
    if (s.name == name) return s;
  throw Error("plan", "no step " + name);
}

std::vector<std::string> names(const TrainJobPlan& p) {
  std::vector<std::string> v;
  for (const PlanStep& s : p.steps) v.push_back(s.name);
  return v;
}

TEST(Plan, LoraSingleDeviceJobFromTheSdkTypes) {
  types::BuiltinTrainer b;
  b.config.epochs = 1;
  types::LoraConfig lora;
  lora.lora_rank = 8;
  b.config.peft_config = lora;
  types::TorchTuneInstructDataset ds;
  ds.source = types::DataFormat::PARQUET;
  b.config.dataset_preprocess_config = ds;
  types::Initializer init;
  init.dataset = types::HuggingFaceDatasetInitializer{"hf://tatsu-lab/alpaca/data"};
  types::HuggingFaceModelInitializer model{"hf://meta-llama/Llama-3.2-1B-Instruct"};
  model.access_token = "hf_SECRETSECRET";
  init.model = model;
  const auto runtime = to_sdk_runtime(catalog().get("torchtune-llama3.2-1b"));
  const v1alpha1::TrainJob job = make_trainjob(runtime, &init, b, {.name = "lora-demo"});
  const TrainJobPlan plan = build_plan(job, catalog());

  EXPECT_EQ(plan.job_name, "lora-demo");
  EXPECT_EQ(plan.trainer_type, "BuiltinTrainer");
  EXPECT_EQ(plan.model_key, "llama3_2/1B");
  EXPECT_EQ(plan.recipe, "lora_finetune_single_device");
  EXPECT_EQ(plan.config, "llama3_2/1B_lora_single_device");
  EXPECT_EQ(plan.num_nodes, 1);
  EXPECT_EQ(plan.num_proc_per_node, 1);
  EXPECT_EQ(names(plan), (std::vector<std::string>{"dataset-initializer", "model-initializer", "node-0"}));

  const PlanStep& ds_step = step(plan, "dataset-initializer");
  EXPECT_EQ(ds_step.command, (std::vector<std::string>{"ktune", "initializer", "dataset"}));
  EXPECT_EQ(ds_step.env.at("STORAGE_URI"), "hf://tatsu-lab/alpaca/data");
  EXPECT_TRUE(ds_step.depends_on.empty());
  const PlanStep& m = step(plan, "model-initializer");
  EXPECT_EQ(m.env.at("STORAGE_URI"), "hf://meta-llama/Llama-3.2-1B-Instruct");
  EXPECT_EQ(m.env.at("IGNORE_PATTERNS"), "*.msgpack,*.h5,*.bin,*.pt,*.pth");
  EXPECT_EQ(m.env.count("ACCESS_TOKEN"), 0u);
  EXPECT_EQ(m.secret_env.at("ACCESS_TOKEN"), "hf_SECRETSECRET");

  const PlanStep& node = step(plan, "node-0");
  EXPECT_EQ(node.command,
            (std::vector<std::string>{"tune", "run", "lora_finetune_single_device", "--config",
                                      "llama3_2/1B_lora_single_device", "output_dir=/workspace/output",
                                      "tokenizer.path=/workspace/model/original/tokenizer.model",
                                      "checkpointer.checkpoint_dir=/workspace/model", "epochs=1",
                                      "dataset.data_dir=/workspace/dataset/data", "model.lora_rank=8",
                                      "model.lora_attn_modules=[q_proj,v_proj,output_proj]",
                                      "dataset=torchtune.datasets.instruct_dataset", "dataset.source=parquet"}));
  EXPECT_EQ(node.env.at("PET_NNODES"), "1");
  EXPECT_EQ(node.env.at("PET_NPROC_PER_NODE"), "1");
  EXPECT_EQ(node.env.at("PET_NODE_RANK"), "0");
  EXPECT_EQ(node.env.count("PET_MASTER_ADDR"), 0u) << "torchtune uses the command-line rendezvous";
  EXPECT_EQ(node.depends_on, (std::vector<std::string>{"dataset-initializer", "model-initializer"}));
  EXPECT_EQ(node.container_port, 29500);
  EXPECT_EQ(node.device, "gpu");
  EXPECT_EQ(node.image, "ghcr.io/ktune/ktune-trainer:0.1.0");
  EXPECT_EQ(node.working_dir, "/workspace");

  const std::string text = plan.to_text();
  EXPECT_EQ(text.find("hf_SECRETSECRET"), std::string::npos) << text;
  const std::string expected_head =
      "TrainJob lora-demo  runtime torchtune-llama3.2-1b  (BuiltinTrainer, torchtune)\n"
      "  model     llama3_2/1B\n"
      "  recipe    lora_finetune_single_device\n"
      "  config    llama3_2/1B_lora_single_device\n"
      "  layout    1 node x 1 process\n"
      "  workspace /workspace\n"
      "steps:\n"
      "  1. dataset-initializer\n"
      "       image:   ghcr.io/ktune/ktune-initializer:0.1.0\n"
      "       command: ktune initializer dataset\n"
      "       workdir: /workspace\n"
      "       env:     STORAGE_URI=hf://tatsu-lab/alpaca/data\n"
      "       device:  cpu x 1\n"
      "  2. model-initializer\n"
      "       image:   ghcr.io/ktune/ktune-initializer:0.1.0\n"
      "       command: ktune initializer model\n"
      "       workdir: /workspace\n"
      "       env:     IGNORE_PATTERNS=*.msgpack,*.h5,*.bin,*.pt,*.pth\n";
  EXPECT_EQ(text.substr(0, expected_head.size()), expected_head) << text;
  EXPECT_NE(text.find("       env:     ACCESS_TOKEN=***\n"), std::string::npos) << text;
  EXPECT_NE(text.find("  3. node-0  (rank 0, 1 process)  after dataset-initializer, model-initializer\n"),
            std::string::npos) << text;
  EXPECT_NE(text.find("command: tune run lora_finetune_single_device --config llama3_2/1B_lora_single_device "
                      "output_dir=/workspace/output"),
            std::string::npos) << text;
  EXPECT_NE(text.find("'model.lora_attn_modules=[q_proj,v_proj,output_proj]'"), std::string::npos) << text;
}

TEST(Plan, MultiNodeJobHasOneStepPerRankAndTheRendezvousEndpoint) {
  auto j = tune_job("torchtune-llama3.3-70b", {"epochs=1"});
  j.metadata.name = "big";
  j.spec.trainer->num_nodes = 2;
  const TrainJobPlan plan = build_plan(j, catalog());
  EXPECT_EQ(plan.config, "llama3_3/70B_full_multinode");
  EXPECT_EQ(plan.recipe, "full_finetune_distributed");
  EXPECT_EQ(plan.num_proc_per_node, 8);
  ASSERT_EQ(names(plan), (std::vector<std::string>{"dataset-initializer", "model-initializer", "node-0", "node-1"}));
  for (int rank = 0; rank < 2; ++rank) {
    const PlanStep& n = step(plan, "node-" + std::to_string(rank));
    EXPECT_EQ(n.node_rank, rank);
    EXPECT_EQ(n.env.at("PET_NODE_RANK"), std::to_string(rank));
    EXPECT_EQ(n.env.at("PET_NNODES"), "2");
    EXPECT_EQ(n.env.at("PET_NPROC_PER_NODE"), "8");
    EXPECT_EQ(n.num_proc, 8);
    EXPECT_EQ(n.device_count, "8");
    ASSERT_GE(n.command.size(), 3u);
    EXPECT_EQ(n.command[2], "--rdzv_endpoint=big-node-0-0.big:29500");
    EXPECT_EQ(n.command[3], "full_finetune_distributed");
  }
}

TEST(Plan, RendezvousOnlyWhenMoreThanOneProcess) {
  const TrainJobPlan one = build_plan(tune_job("torchtune-qwen2.5-0.5b"), catalog());
  for (const std::string& a : step(one, "node-0").command) EXPECT_EQ(a.find("--rdzv_endpoint"), std::string::npos);
  const TrainJobPlan two = build_plan(tune_job("torchtune-qwen2.5-7b"), catalog());  // 2 GPUs
  EXPECT_EQ(step(two, "node-0").command[2], "--rdzv_endpoint=job-1-node-0-0.job-1:29500");
  EXPECT_EQ(two.config, "qwen2_5/7B_full");
}

TEST(Plan, AutoProcessesCountGpusElseCpus) {
  auto j = tune_job("torchtune-llama3.2-1b");
  v1alpha1::ResourceRequirements cpu;
  cpu.requests["cpu"] = "4";
  cpu.limits["cpu"] = "8";
  j.spec.trainer->resources_per_node = cpu;
  TrainJobPlan p = build_plan(j, catalog());
  EXPECT_EQ(p.num_proc_per_node, 4) << "CPU requests before limits";
  EXPECT_EQ(step(p, "node-0").device, "cpu");
  EXPECT_EQ(p.config, "llama3_2/1B_full");
  cpu.requests.clear();
  cpu.limits["cpu"] = "500m";
  j.spec.trainer->resources_per_node = cpu;
  EXPECT_EQ(build_plan(j, catalog()).num_proc_per_node, 1) << "at least 1";
  v1alpha1::ResourceRequirements gpu;
  gpu.requests["nvidia.com/gpu"] = "2";
  gpu.limits["nvidia.com/gpu"] = "4";
  gpu.limits["cpu"] = "32";
  j.spec.trainer->resources_per_node = gpu;
  p = build_plan(j, catalog());
  EXPECT_EQ(p.num_proc_per_node, 2) << "GPU requests before limits, GPUs before CPUs";
  EXPECT_EQ(step(p, "node-0").device, "gpu");
  j.spec.trainer->num_proc_per_node = "3";
  EXPECT_EQ(build_plan(j, catalog()).num_proc_per_node, 3) << "an explicit count wins";
  j.spec.trainer->num_proc_per_node = "cpu";
  EXPECT_EQ(build_plan(j, catalog()).num_proc_per_node, 32);
}

TEST(Plan, QwenGetsItsTokenizerFilesAndOverridesComeBeforeUserArgs) {
  const TrainJobPlan p =
      build_plan(tune_job("torchtune-qwen2.5-1.5b", {"dataset=torchtune.datasets.alpaca_dataset", "epochs=3"}), catalog());
  EXPECT_EQ(step(p, "node-0").command,
            (std::vector<std::string>{"tune", "run", "full_finetune_single_device", "--config",
                                      "qwen2_5/1.5B_full_single_device", "output_dir=/workspace/output",
                                      "tokenizer.path=/workspace/model/vocab.json",
                                      "tokenizer.merges_file=/workspace/model/merges.txt",
                                      "checkpointer.checkpoint_dir=/workspace/model",
                                      "dataset=torchtune.datasets.alpaca_dataset", "epochs=3"}))
      << "a job naming its dataset component gets exactly upstream's command";
}

TEST(Plan, RuntimeDatasetDefaultsFillInWhenTheJobNamesNoDatasetComponent) {
  // No dataset args at all: the runtime's dataset (its default initializer's parquet files).
  const TrainJobPlan p1 = build_plan(tune_job("torchtune-llama3.2-1b", {"epochs=1"}), catalog());
  const auto& none = step(p1, "node-0").command;
  const std::vector<std::string> tail(none.end() - 4, none.end());
  EXPECT_EQ(tail, (std::vector<std::string>{"dataset=torchtune.datasets.instruct_dataset", "dataset.source=parquet",
                                            "dataset.data_dir=/workspace/dataset/data", "epochs=1"}));
  // A bare hf://org/repo dataset (data_dir=/workspace/dataset/.): the user's location, the runtime's component.
  const TrainJobPlan p2 = build_plan(tune_job("torchtune-llama3.2-1b", {"dataset.data_dir=/workspace/dataset/."}), catalog());
  const auto& bare = step(p2, "node-0").command;
  const std::vector<std::string> bare_tail(bare.end() - 3, bare.end());
  EXPECT_EQ(bare_tail, (std::vector<std::string>{"dataset=torchtune.datasets.instruct_dataset", "dataset.source=parquet",
                                                 "dataset.data_dir=/workspace/dataset/."}));
  // A JSON Lines file: its format, not the runtime's parquet.
  const TrainJobPlan p3 =
      build_plan(tune_job("torchtune-llama3.2-1b", {"dataset.data_files=/workspace/dataset/train.jsonl"}), catalog());
  const auto& files = step(p3, "node-0").command;
  const std::vector<std::string> files_tail(files.end() - 3, files.end());
  EXPECT_EQ(files_tail, (std::vector<std::string>{"dataset=torchtune.datasets.instruct_dataset", "dataset.source=json",
                                                  "dataset.data_files=/workspace/dataset/train.jsonl"}));
}

TEST(Plan, CustomTrainerOnTorchDistributedGetsTheTorchrunEnv) {
  v1alpha1::TrainJob j;
  j.metadata.name = "cust";
  j.spec.runtime_ref.name = "torch-distributed";
  v1alpha1::Trainer t;
  t.command = {"python", "train.py"};
  t.args = {"--lr", "0.1"};
  t.env = {{"MY_FLAG", std::string("on"), {}}};
  t.num_nodes = 2;
  v1alpha1::ResourceRequirements r;
  r.limits["cpu"] = "2";
  t.resources_per_node = r;
  j.spec.trainer = t;
  const TrainJobPlan p = build_plan(j, catalog());
  EXPECT_EQ(p.trainer_type, "CustomTrainer");
  EXPECT_TRUE(p.recipe.empty());
  ASSERT_EQ(names(p), (std::vector<std::string>{"node-0", "node-1"}));
  const PlanStep& n1 = step(p, "node-1");
  EXPECT_EQ(n1.command, (std::vector<std::string>{"python", "train.py", "--lr", "0.1"}));
  EXPECT_EQ(n1.env.at("PET_MASTER_ADDR"), "cust-node-0-0.cust");
  EXPECT_EQ(n1.env.at("PET_MASTER_PORT"), "29500");
  EXPECT_EQ(n1.env.at("PET_NODE_RANK"), "1");
  EXPECT_EQ(n1.env.at("PET_NPROC_PER_NODE"), "2");
  EXPECT_EQ(n1.env.at("MY_FLAG"), "on");
  EXPECT_TRUE(n1.depends_on.empty());
  EXPECT_EQ(n1.image, "pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime");
}

TEST(Plan, AJobWithoutTrainerRunsTheRuntimeCommandAsWritten) {
  v1alpha1::TrainJob j;
  j.metadata.name = "plain";
  j.spec.runtime_ref.name = "torchtune-gemma2-2b";
  const TrainJobPlan p = build_plan(j, catalog());
  const PlanStep& n = step(p, "node-0");
  ASSERT_GE(n.command.size(), 6u);
  EXPECT_EQ(std::vector<std::string>(n.command.begin(), n.command.begin() + 6),
            (std::vector<std::string>{"tune", "run", "--rdzv_endpoint=localhost:29500", "full_finetune_distributed",
                                      "--config", "gemma2/2B_full"}));
  EXPECT_EQ(p.recipe, "full_finetune_distributed");
  EXPECT_EQ(p.config, "gemma2/2B_full");
  EXPECT_EQ(n.env.at("PET_NPROC_PER_NODE"), "2");
  EXPECT_EQ(n.env.at("PET_MASTER_PORT"), "29500") << "not the tune run mutation: torchrun reads the PET_* env";
}

TEST(Plan, AnInitializerWithNothingToDownloadIsLeftOut) {
  RuntimeCatalog c = RuntimeCatalog::builtin();
  v1alpha1::TrainingRuntime rt = c.get("torchtune-llama3.2-1b");
  auto& jobs = rt.template_["spec"]["replicatedJobs"];
  jobs[0]["template"]["spec"]["template"]["spec"]["containers"][0].erase("env");  // no default dataset
  c.add(rt);
  TrainJobPlan p = build_plan(tune_job("torchtune-llama3.2-1b"), c);
  EXPECT_EQ(names(p), (std::vector<std::string>{"model-initializer", "node-0"}));
  EXPECT_EQ(step(p, "node-0").depends_on, (std::vector<std::string>{"model-initializer"}));
  auto j = tune_job("torchtune-llama3.2-1b");
  v1alpha1::Initializer init;
  init.dataset = v1alpha1::InitializerSpec{std::string("s3://bucket/data"), {{"ENDPOINT", std::string("http://127.0.0.1:9000"), {}},
                                                                             {"SECRET_ACCESS_KEY", std::string("sk"), {}}}, std::nullopt};
  j.spec.initializer = init;
  p = build_plan(j, c);
  EXPECT_EQ(names(p), (std::vector<std::string>{"dataset-initializer", "model-initializer", "node-0"}));
  EXPECT_EQ(step(p, "dataset-initializer").env.at("STORAGE_URI"), "s3://bucket/data");
  EXPECT_EQ(step(p, "dataset-initializer").env.at("ENDPOINT"), "http://127.0.0.1:9000");
  EXPECT_EQ(step(p, "dataset-initializer").secret_env.at("SECRET_ACCESS_KEY"), "sk");
}

TEST(Plan, InvalidJobsAreNotPlanned) {
  auto j = tune_job("torchtune-llama3.2-1b", {"output_dir=/x"});
  j.spec.trainer->num_nodes = 2;
  try {
    build_plan(j, catalog());
    FAIL();
  } catch (const Errors& e) {
    EXPECT_EQ(e.errors().size(), 2u) << e.what();
  }
}

TEST(Plan, WithWorkspaceReRootsPathsOnly) {
  auto j = tune_job("torchtune-qwen2.5-0.5b", {"dataset.data_files=/workspace/dataset/a.json,/workspace/dataset/b.json",
                                               "metric_logger.log_dir=/workspaces/other"});
  const TrainJobPlan p = build_plan(j, catalog()).with_workspace("/tmp/ktune/jobs/job-1");
  const PlanStep& n = step(p, "node-0");
  EXPECT_EQ(n.working_dir, "/tmp/ktune/jobs/job-1");
  EXPECT_NE(std::find(n.command.begin(), n.command.end(), "output_dir=/tmp/ktune/jobs/job-1/output"), n.command.end());
  EXPECT_NE(std::find(n.command.begin(), n.command.end(),
                      "dataset.data_files=/tmp/ktune/jobs/job-1/dataset/a.json,/tmp/ktune/jobs/job-1/dataset/b.json"),
            n.command.end());
  EXPECT_NE(std::find(n.command.begin(), n.command.end(), "metric_logger.log_dir=/workspaces/other"), n.command.end())
      << "/workspaces is another path";
  EXPECT_EQ(p.workspace, "/tmp/ktune/jobs/job-1");
}

TEST(Catalog, MissingRuntimesAndDirectoriesAreNamed) {
  try {
    catalog().get("nope");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), "runtime nope");
    EXPECT_NE(e.what_only().find("available: torch-distributed, torchtune-gemma2-27b"), std::string::npos) << e.what();
  }
  EXPECT_THROW(RuntimeCatalog::load_dir("/nonexistent/ktune-runtimes"), Error);
}

TEST(Catalog, ALaterRuntimeOfTheSameNameReplacesAndKindsMustMatchTheRef) {
  RuntimeCatalog c = RuntimeCatalog::builtin();
  v1alpha1::TrainingRuntime rt = c.get("torch-distributed");
  rt.kind = "TrainingRuntime";
  rt.metadata.namespace_ = "team";
  c.add(rt);
  EXPECT_EQ(c.names().size(), 14u);
  EXPECT_EQ(c.get("torch-distributed").kind, "TrainingRuntime");
  v1alpha1::TrainJob j;
  j.metadata.name = "k";
  j.spec.runtime_ref.name = "torch-distributed";
  v1alpha1::Trainer t;
  t.command = {"python", "x.py"};
  j.spec.trainer = t;
  try {
    build_plan(j, c);
    FAIL();
  } catch (const Errors& e) {
    ASSERT_EQ(e.errors().size(), 1u);
    EXPECT_EQ(e.errors()[0].where(), "spec.runtimeRef.kind");
  }
  j.spec.runtime_ref.kind = "TrainingRuntime";
  EXPECT_EQ(build_plan(j, c).steps.size(), 1u);
  EXPECT_EQ(to_sdk_runtime(c.get("torch-distributed")).kind, types::RuntimeKind::TrainingRuntime);
}

TEST(TrainJobYaml, RenderedForKubernetesWithSecretsMasked) {
  types::BuiltinTrainer b;
  b.config.epochs = 1;
  types::Initializer init;
  types::HuggingFaceModelInitializer m{"hf://org/model"};
  m.access_token = "hf_TOPSECRET";
  init.model = m;
  const auto job = make_trainjob(to_sdk_runtime(catalog().get("torchtune-llama3.2-1b")), &init, b, {.name = "yaml-job"});
  const std::string yaml = render_trainjob_yaml(job);
  EXPECT_EQ(yaml.find("hf_TOPSECRET"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("value: \"***\""), std::string::npos) << yaml;
  EXPECT_NE(render_trainjob_yaml(job, true).find("hf_TOPSECRET"), std::string::npos);
  const auto back = v1alpha1::trainjob_from_json(v1alpha1::parse_yaml_documents(yaml, "y").at(0), "y");
  EXPECT_EQ(back.metadata.name, "yaml-job");
  EXPECT_EQ(back.spec.trainer->command, (std::vector<std::string>{"tune", "run"}));
  EXPECT_EQ(back.spec.runtime_ref.name, "torchtune-llama3.2-1b");
}

// Upstream's CustomTrainerContainer: the job's image on every node with its resources and env; on
// torch-distributed (no command of its own) the image's entrypoint runs, unless TrainerCommand /
// TrainerArgs give one. The plan says it needs a cluster. Upstream's rules are kept: not on a
// torchtune runtime, the options not with another trainer (in upstream's words), an image required.
TEST(Plan, ACustomTrainerContainerRunsItsImageOnEveryNode) {
  const auto runtime = to_sdk_runtime(catalog().get("torch-distributed"));
  types::CustomTrainerContainer container;
  container.image = "registry.example.com/team/train:3";
  container.num_nodes = 2;
  container.resources_per_node = {{"gpu", "1"}, {"memory", "8Gi"}};
  container.env = {{"EPOCHS", "3"}};
  const v1alpha1::TrainJob job = make_trainjob(runtime, nullptr, container, {.name = "boxed"});
  ASSERT_TRUE(job.spec.trainer);
  EXPECT_EQ(job.spec.trainer->image, "registry.example.com/team/train:3");
  EXPECT_EQ(job.spec.trainer->num_nodes, 2);
  EXPECT_TRUE(job.spec.trainer->command.empty());
  const TrainJobPlan plan = build_plan(job, catalog());
  ASSERT_EQ(plan.steps.size(), 2u);
  for (const PlanStep& s : plan.steps) {
    EXPECT_EQ(s.image, "registry.example.com/team/train:3");
    EXPECT_TRUE(s.command.empty());  // the image's entrypoint
    EXPECT_EQ(s.env.at("EPOCHS"), "3");
  }
  EXPECT_NE(plan.to_text().find("command: (the image's entrypoint)"), std::string::npos) << plan.to_text();
  EXPECT_EQ(kubernetes_only_parts(nullptr, container, {}), (std::vector<std::string>{"CustomTrainerContainer"}));

  types::JobOptions overrides{.name = "boxed-cmd"};
  overrides.trainer_command = std::vector<std::string>{"python", "train.py"};
  overrides.trainer_args = std::vector<std::string>{"--epochs", "3"};
  const TrainJobPlan with_command = build_plan(make_trainjob(runtime, nullptr, container, overrides), catalog());
  EXPECT_EQ(with_command.steps[0].command, (std::vector<std::string>{"python", "train.py", "--epochs", "3"}));
  EXPECT_EQ(kubernetes_only_parts(nullptr, container, overrides),
            (std::vector<std::string>{"CustomTrainerContainer", "TrainerCommand", "TrainerArgs"}));
  const v1alpha1::TrainJob bare = make_trainjob(runtime, nullptr, std::monostate{}, overrides);  // no trainer: as upstream
  EXPECT_EQ(bare.spec.trainer->command, (std::vector<std::string>{"python", "train.py"}));
  EXPECT_EQ(bare.spec.trainer->args, (std::vector<std::string>{"--epochs", "3"}));

  types::CustomTrainer function;
  function.script = "print(1)";
  try {
    make_trainjob(runtime, nullptr, function, overrides);
    FAIL() << "TrainerCommand with a CustomTrainer";
  } catch (const Errors& e) {
    EXPECT_NE(std::string(e.what()).find("TrainerCommand can only be used with CustomTrainerContainer. CustomTrainer generates its own "
                                         "command from the function, and BuiltinTrainer uses pre-configured commands."),
              std::string::npos) << e.what();
  }
  types::JobOptions args_only;
  args_only.trainer_args = std::vector<std::string>{"x"};
  try {
    make_trainjob(runtime, nullptr, types::BuiltinTrainer{}, args_only);
    FAIL() << "TrainerArgs with a BuiltinTrainer";
  } catch (const Errors& e) {
    EXPECT_NE(std::string(e.what()).find("TrainerArgs can only be used with CustomTrainerContainer"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_trainjob(to_sdk_runtime(catalog().get("torchtune-llama3.2-1b")), nullptr, container), Error);
  EXPECT_THROW(make_trainjob(runtime, nullptr, types::CustomTrainerContainer{}), Error);  // no image
}

// Upstream's DataCacheInitializer: the TrainJob's dataset initializer carries the cache (its URI and
// upstream's env); a CustomTrainer runtime takes it, a torchtune runtime refuses it (its trainer
// reads files), upstream's checks on the fields hold, and the plan says it needs a cluster.
TEST(Plan, ADataCacheDatasetGoesToTheClusterForACustomTrainer) {
  types::DataCacheInitializer cache;
  cache.storage_uri = "cache://sales/orders";
  cache.metadata_loc = "s3://lake/orders/metadata.json";
  cache.num_data_nodes = 3;
  types::Initializer init;
  init.dataset = cache;
  types::CustomTrainer trainer;
  trainer.command = {"python", "train.py"};
  const auto runtime = to_sdk_runtime(catalog().get("torch-distributed"));
  const v1alpha1::TrainJob job = make_trainjob(runtime, &init, trainer, {.name = "cached"});
  ASSERT_TRUE(job.spec.initializer && job.spec.initializer->dataset);
  EXPECT_EQ(*job.spec.initializer->dataset->storage_uri, "cache://sales/orders");
  EXPECT_EQ(job.spec.initializer->dataset->env.at(0).name, "CLUSTER_SIZE");
  EXPECT_EQ(*job.spec.initializer->dataset->env.at(0).value, "4");  // the data nodes and the head
  EXPECT_EQ(kubernetes_only_parts(&init, trainer, {}), (std::vector<std::string>{"DataCacheInitializer"}));

  const auto tune = to_sdk_runtime(catalog().get("torchtune-llama3.2-1b"));
  try {
    build_plan(make_trainjob(tune, &init, types::BuiltinTrainer{}, {.name = "cached-tune"}), catalog());
    FAIL() << "a data cache on a torchtune runtime";
  } catch (const Errors& e) {
    EXPECT_NE(std::string(e.what()).find("a data cache (cache://) feeds a CustomTrainer's function"), std::string::npos) << e.what();
  }
  cache.num_data_nodes = 1;
  cache.storage_uri = "cache://orders";
  init.dataset = cache;
  try {
    make_trainjob(runtime, &init, trainer);
    FAIL() << "upstream's checks";
  } catch (const Errors& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("num_data_nodes: must be greater than 1, got 1"), std::string::npos) << what;
    EXPECT_NE(what.find("must be in format 'cache://<SCHEMA_NAME>/<TABLE_NAME>', got 'cache://orders'"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace ktune
