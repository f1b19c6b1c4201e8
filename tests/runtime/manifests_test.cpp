// The runtime catalog of manifests/: every runtime parses, is named and labelled like upstream's,
// has the JobSet shape (initializers, node depending on both, one /workspace volume), plans a
// default job, and is valid for the real Kubeflow Trainer CRDs (schema excerpt + the upstream
// API models, through tests/runtime/check_trainer_schema.py, skipped when jsonschema is missing).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/planner.h"
#include "runtime/recipe_table.h"
#include "runtime/runtime_catalog.h"
#include "runtime/trainjob_builder.h"

namespace ktune {
namespace {

namespace fs = std::filesystem;
const std::string kSource = KTUNE_SOURCE_DIR;

std::vector<std::string> manifest_files() {
  std::vector<std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(kSource + "/manifests"))
    if (e.is_regular_file() && e.path().extension() == ".yaml") files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(Manifests, ThirteenModelRuntimesAndTorchDistributed) {
  const RuntimeCatalog c = RuntimeCatalog::builtin();
  const std::vector<std::string> want{
      "torch-distributed",      "torchtune-gemma2-27b",   "torchtune-gemma2-2b",    "torchtune-gemma2-9b",
      "torchtune-llama3.1-70b", "torchtune-llama3.1-8b",  "torchtune-llama3.2-1b",  "torchtune-llama3.2-3b",
      "torchtune-llama3.3-70b", "torchtune-mistral-7b",   "torchtune-qwen2.5-0.5b", "torchtune-qwen2.5-1.5b",
      "torchtune-qwen2.5-3b",   "torchtune-qwen2.5-7b"};
  EXPECT_EQ(c.names(), want);
  // The same set read from the files on disk as from the embedded copies.
  const RuntimeCatalog disk = RuntimeCatalog::load_dir(kSource + "/manifests");
  EXPECT_EQ(disk.names(), want);
  for (const auto& rt : c.runtimes()) EXPECT_EQ(v1alpha1::to_json(rt), v1alpha1::to_json(disk.get(rt.metadata.name)));
}

TEST(Manifests, EmbeddedCopiesEqualTheFilesOnDisk) {
  const auto files = manifest_files();
  ASSERT_EQ(embedded_manifests().size(), files.size());
  for (const EmbeddedManifest& m : embedded_manifests())
    EXPECT_EQ(std::string(m.text), read(kSource + "/manifests/" + m.path)) << m.path << ": re-run the CMake configure step";
}

TEST(Manifests, TorchtuneRuntimesAreNamedLabelledAndFiledLikeUpstream) {
  const std::regex name_shape("^torchtune-(llama3\\.[123]|qwen2\\.5|gemma2|mistral)-[0-9.]+b$");
  int count = 0;
  for (const std::string& file : manifest_files()) {
    if (file.find("/torchtune/") == std::string::npos || file.find("kustomization") != std::string::npos) continue;
    const RuntimeCatalog one = [&] { RuntimeCatalog r; r.load_file(file); return r; }();
    ASSERT_EQ(one.runtimes().size(), 1u) << file;
    const auto& rt = one.runtimes()[0];
    const std::string& name = rt.metadata.name;
    EXPECT_TRUE(std::regex_match(name, name_shape)) << name;
    EXPECT_EQ(rt.kind, "ClusterTrainingRuntime");
    EXPECT_EQ(rt.framework(), "torchtune") << name;
    const std::string key = model_key_from_runtime_name(name);
    const auto models = supported_models();
    EXPECT_NE(std::find(models.begin(), models.end(), key), models.end()) << name;
    // manifests/runtimes/torchtune/<family>/<family>_<SIZE>.yaml, as upstream files them.
    const std::string family = key.substr(0, key.find('/')), size = key.substr(key.find('/') + 1);
    EXPECT_EQ(fs::path(file).filename().string(), family + "_" + size + ".yaml") << file;
    EXPECT_EQ(fs::path(file).parent_path().filename().string(), family) << file;
    ++count;
  }
  EXPECT_EQ(count, 13);
}

TEST(Manifests, EachTorchtuneRuntimeHasTheJobSetShape) {
  const RuntimeCatalog c = RuntimeCatalog::builtin();
  for (const auto& rt : c.runtimes()) {
    if (rt.framework() != "torchtune") continue;
    const std::string& name = rt.metadata.name;
    const std::string key = model_key_from_runtime_name(name);
    const auto jobs = rt.replicated_jobs();
    ASSERT_EQ(jobs.size(), 3u) << name;
    EXPECT_EQ(jobs[0].name, "dataset-initializer");
    EXPECT_EQ(jobs[0].ancestor, "dataset-initializer");
    EXPECT_EQ(jobs[1].name, "model-initializer");
    EXPECT_EQ(jobs[2].name, "node");
    EXPECT_EQ(jobs[2].ancestor, "trainer");
    ASSERT_EQ(jobs[2].depends_on.size(), 2u) << name;
    EXPECT_EQ(jobs[2].depends_on[0].name, "dataset-initializer");
    EXPECT_EQ(jobs[2].depends_on[1].name, "model-initializer");
    for (const auto& d : jobs[2].depends_on) EXPECT_EQ(d.status, "Complete");
    // One shared volume, mounted at /workspace by every container.
    const auto& vcp = rt.template_["spec"]["volumeClaimPolicies"];
    ASSERT_EQ(vcp.size(), 1u);
    const std::string volume = vcp[0]["templates"][0]["metadata"]["name"];
    for (const auto& job : jobs)
      for (const auto& ct : job.containers) {
        ASSERT_EQ(ct.volume_mounts.size(), 1u) << name << " " << ct.name;
        EXPECT_EQ(ct.volume_mounts[0].name, volume);
        EXPECT_EQ(ct.volume_mounts[0].mount_path, "/workspace");
      }
    const auto* node = jobs[2].find_container("node");
    ASSERT_NE(node, nullptr);
    EXPECT_EQ(node->image, "ghcr.io/ktune/ktune-trainer:0.1.0");
    EXPECT_EQ(jobs[0].containers[0].command, (std::vector<std::string>{"ktune", "initializer", "dataset"}));
    EXPECT_EQ(jobs[1].containers[0].command, (std::vector<std::string>{"ktune", "initializer", "model"}));
    // The node command as upstream spells it.
    const std::vector<std::string> head{"tune", "run", "--rdzv_endpoint=localhost:29500", "full_finetune_distributed",
                                        "--config", key + "_full"};
    ASSERT_GE(node->command.size(), head.size());
    EXPECT_EQ(std::vector<std::string>(node->command.begin(), node->command.begin() + 6), head) << name;
    EXPECT_TRUE(torchtune_config_exists(key + "_full"));
    auto has = [&](const std::string& arg) {
      return std::find(node->command.begin(), node->command.end(), arg) != node->command.end();
    };
    EXPECT_TRUE(has("output_dir=/workspace/output")) << name;
    EXPECT_TRUE(has("checkpointer.checkpoint_dir=/workspace/model")) << name;
    EXPECT_TRUE(has("dataset.data_dir=/workspace/dataset/data")) << name;
    if (key.rfind("qwen", 0) == 0) {
      EXPECT_TRUE(has("tokenizer.path=/workspace/model/vocab.json")) << name;
      EXPECT_TRUE(has("tokenizer.merges_file=/workspace/model/merges.txt")) << name;
    } else if (key.rfind("llama", 0) == 0) {
      EXPECT_TRUE(has("tokenizer.path=/workspace/model/original/tokenizer.model")) << name;
    } else {
      EXPECT_TRUE(has("tokenizer.path=/workspace/model/tokenizer.model")) << name;
    }
    const auto sdk = to_sdk_runtime(rt);
    EXPECT_EQ(sdk.trainer.trainer_type, types::TrainerType::BuiltinTrainer);
    EXPECT_EQ(sdk.trainer.device, "gpu");
    ASSERT_TRUE(sdk.pretrained_model) << name;
  }
}

TEST(Manifests, EveryRuntimePlansADefaultAndALoraJob) {
  const RuntimeCatalog c = RuntimeCatalog::builtin();
  for (const auto& rt : c.runtimes()) {
    if (rt.framework() != "torchtune") continue;
    const auto sdk = to_sdk_runtime(rt);
    types::BuiltinTrainer full;
    types::BuiltinTrainer lora;
    lora.config.peft_config = types::LoraConfig{};
    for (const auto* b : {&full, &lora}) {
      const auto job = make_trainjob(sdk, nullptr, *b, {.name = "check"});
      try {
        const TrainJobPlan p = build_plan(job, c);
        EXPECT_TRUE(c.configs().contains(p.config)) << rt.metadata.name << " " << p.config;
        EXPECT_EQ(p.steps.size(), 3u);
      } catch (const std::exception& e) {
        ADD_FAILURE() << rt.metadata.name << ": " << e.what();
      }
    }
  }
}

TEST(Manifests, ListRuntimesGivesTheSdkTable) {
  const auto runtimes = list_runtimes(RuntimeCatalog::builtin());
  ASSERT_EQ(runtimes.size(), 14u);
  for (const auto& r : runtimes) {
    if (r.name == "torch-distributed") {
      EXPECT_EQ(r.trainer.trainer_type, types::TrainerType::CustomTrainer);
      EXPECT_EQ(r.trainer.framework, "torch");
      EXPECT_EQ(r.trainer.command, (std::vector<std::string>{"torchrun"}));
      continue;
    }
    EXPECT_EQ(r.trainer.command, (std::vector<std::string>{"tune", "run"}));
    if (r.name == "torchtune-llama3.3-70b") {
      EXPECT_EQ(r.trainer.device_count, "8");
      EXPECT_EQ(*r.pretrained_model, "meta-llama/Llama-3.3-70B-Instruct");
    }
    if (r.name == "torchtune-qwen2.5-1.5b") {
      EXPECT_EQ(r.trainer.device_count, "1");
    }
  }
}

int run_schema_check(const std::vector<std::string>& files, std::string* output) {
  const std::string out = (fs::temp_directory_path() / ("ktune_schema_" + std::to_string(::getpid()) + ".txt")).string();
  std::string cmd = "python3 " + kSource + "/tests/runtime/check_trainer_schema.py";
  for (const auto& f : files) cmd += " '" + f + "'";
  cmd += " > '" + out + "' 2>&1";
  const int status = std::system(cmd.c_str());
  *output = read(out);
  fs::remove(out);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(Manifests, TheSchemaCheckRefusesABrokenRuntime) {
  std::string text = read(kSource + "/manifests/runtimes/torchtune/llama3_2/llama3_2_1B.yaml");
  text.replace(text.find("status: Complete"), 16, "status: Finished");
  const std::string bad = (fs::temp_directory_path() / ("ktune_bad_" + std::to_string(::getpid()) + ".yaml")).string();
  std::ofstream(bad) << text;
  std::string output;
  const int rc = run_schema_check({"--schema-only", bad}, &output);
  fs::remove(bad);
  if (rc == 77) GTEST_SKIP() << "python3 jsonschema/pyyaml missing";
  EXPECT_EQ(rc, 1) << output;
  EXPECT_NE(output.find("'Finished' is not one of"), std::string::npos) << output;
}

// One Python run for all (importing the upstream API models takes seconds).
TEST(Manifests, RuntimesAndRenderedTrainJobsAreValidForTheCrdSchema) {
  const RuntimeCatalog c = RuntimeCatalog::builtin();
  types::BuiltinTrainer b;
  b.config.epochs = 1;
  b.config.num_nodes = 1;
  b.config.resources_per_node = {{"gpu", "1"}, {"memory", "16Gi"}};
  b.config.peft_config = types::LoraConfig{};
  types::Initializer init;
  init.dataset = types::HuggingFaceDatasetInitializer{"tatsu-lab/alpaca/data"};
  types::S3ModelInitializer s3;
  s3.storage_uri = "s3://bucket/model";
  s3.secret_access_key = "sk";
  init.model = s3;
  types::CustomTrainer custom;
  custom.command = {"python", "train.py"};
  custom.num_nodes = 2;
  custom.resources_per_node = {{"cpu", "2"}};
  std::vector<std::string> files = manifest_files();
  int i = 0;
  for (const auto& job : {make_trainjob(to_sdk_runtime(c.get("torchtune-llama3.2-1b")), &init, b),
                          make_trainjob(to_sdk_runtime(c.get("torch-distributed")), nullptr, custom)}) {
    const std::string f = (fs::temp_directory_path() / ("ktune_job_" + std::to_string(::getpid()) + "_" +
                                                        std::to_string(i++) + ".yaml")).string();
    std::ofstream(f) << render_trainjob_yaml(job);
    files.push_back(f);
  }
  std::string output;
  const int rc = run_schema_check(files, &output);
  for (const auto& f : files)
    if (f.find("ktune_job_") != std::string::npos) fs::remove(f);
  if (rc == 77) GTEST_SKIP() << "python3 jsonschema/pyyaml missing: " << output;
  EXPECT_EQ(rc, 0) << output;
  EXPECT_NE(output.find("checked 16 objects"), std::string::npos) << "14 runtimes and 2 TrainJobs\n" << output;
}

}  // namespace
}  // namespace ktune
