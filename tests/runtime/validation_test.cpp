// Validation, one test per rule (each with the field path it must name), and one job with many
// problems reported together. Runs against the built-in runtime catalog (manifests/) with
// torchtune's own config set, where upstream's rules apply; the last tests show ktune's bundled
// configs lifting the rules where its trainer ships the config.
#include <gtest/gtest.h>

#include "core/error.h"
#include "runtime/recipe_table.h"
#include "runtime/runtime_catalog.h"
#include "runtime/validation.h"

namespace ktune {
namespace {

const RuntimeCatalog& catalog() {
  static const RuntimeCatalog c = [] {
    RuntimeCatalog r = RuntimeCatalog::builtin();
    r.set_configs(ConfigSet::torchtune());
    return r;
  }();
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

void set_gpus(v1alpha1::TrainJob& j, const std::string& n) {
  v1alpha1::ResourceRequirements r;
  r.limits["nvidia.com/gpu"] = n;
  j.spec.trainer->resources_per_node = r;
}

// The errors at `path` whose message contains `text`.
int count(const std::vector<Error>& errors, const std::string& path, const std::string& text) {
  int n = 0;
  for (const Error& e : errors) n += e.where() == path && e.what_only().find(text) != std::string::npos;
  return n;
}

std::string dump(const std::vector<Error>& errors) {
  std::string s;
  for (const Error& e : errors) s += std::string("\n  ") + e.what();
  return s;
}

const std::vector<std::string> kLora{"model.lora_rank=8", "model.lora_attn_modules=[q_proj,v_proj,output_proj]"};
const std::vector<std::string> kQlora{"model.quantize_base=True", "model.lora_attn_modules=[q_proj,v_proj,output_proj]"};

TEST(Validation, AValidJobHasNoErrors) {
  EXPECT_TRUE(validate(tune_job("torchtune-llama3.2-1b", kLora), catalog()).empty());
  EXPECT_NO_THROW(validate_or_throw(tune_job("torchtune-qwen2.5-1.5b", {"epochs=1"}), catalog()));
}

TEST(Validation, RuntimeMustExistAndTheErrorListsTheAvailableOnes) {
  const auto errors = validate(tune_job("torchtune-llama9-1b"), catalog());
  ASSERT_EQ(errors.size(), 1u) << dump(errors);
  EXPECT_EQ(errors[0].where(), "spec.runtimeRef.name");
  EXPECT_NE(errors[0].what_only().find("torchtune-llama9-1b not found"), std::string::npos);
  for (const char* name : {"torch-distributed", "torchtune-llama3.2-1b", "torchtune-mistral-7b", "torchtune-qwen2.5-7b"})
    EXPECT_NE(errors[0].what_only().find(name), std::string::npos) << name;
}

TEST(Validation, NameMustBeAnRfc1035LabelOfAtMost63Characters) {
  for (const char* bad : {"My-Job", "1job", "job_1", "job-", "-job", "jöb"}) {
    auto j = tune_job("torchtune-llama3.2-1b");
    j.metadata.name = bad;
    EXPECT_EQ(count(validate(j, catalog()), "metadata.name", "RFC 1035"), 1) << bad;
  }
  auto j = tune_job("torchtune-llama3.2-1b");
  j.metadata.name = "a" + std::string(62, 'b');
  EXPECT_TRUE(validate(j, catalog()).empty());
  j.metadata.name += "c";
  EXPECT_EQ(count(validate(j, catalog()), "metadata.name", "no more than 63 characters; got 64"), 1);
  j.metadata.name = "";
  EXPECT_EQ(count(validate(j, catalog()), "metadata.name", "is required"), 1);
}

TEST(Validation, ReservedPetEnvIsRefused) {
  for (const char* name : {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"}) {
    auto j = tune_job("torchtune-llama3.2-1b");
    j.spec.trainer->env = {{"OK", std::string("1"), {}}, {name, std::string("4"), {}}};
    const auto errors = validate(j, catalog());
    EXPECT_EQ(count(errors, "spec.trainer.env[1].name", std::string("reserved env ") + name), 1) << name << dump(errors);
    EXPECT_EQ(errors.size(), 1u) << dump(errors);
  }
}

TEST(Validation, UnsupportedModelIsRefused) {
  RuntimeCatalog c = catalog();
  v1alpha1::TrainingRuntime phi = c.get("torchtune-llama3.2-1b");
  phi.metadata.name = "torchtune-phi3-mini";
  c.add(phi);
  const auto errors = validate(tune_job("torchtune-phi3-mini"), c);
  EXPECT_EQ(count(errors, "spec.runtimeRef.name", "must have a supported pretrained model, invalid model configured: phi3/MINI"), 1)
      << dump(errors);
  phi.metadata.name = "torchtune-llama";
  c.add(phi);
  EXPECT_EQ(count(validate(tune_job("torchtune-llama"), c), "spec.runtimeRef.name", "torchtune-<family><version>-<size>"), 1);
}

TEST(Validation, MoreThanOneNodeOnlyWhereTorchtuneHasAMultinodeConfig) {
  auto j = tune_job("torchtune-llama3.2-1b");
  j.spec.trainer->num_nodes = 2;
  const auto errors = validate(j, catalog());
  EXPECT_EQ(count(errors, "spec.trainer.numNodes", "must be 1 for llama3_2/1B model"), 1) << dump(errors);
  auto big = tune_job("torchtune-llama3.3-70b");
  big.spec.trainer->num_nodes = 4;
  EXPECT_TRUE(validate(big, catalog()).empty()) << dump(validate(big, catalog()));
}

TEST(Validation, QloraNeedsAModelWithQloraConfigs) {
  const auto errors = validate(tune_job("torchtune-qwen2.5-1.5b", kQlora), catalog());
  EXPECT_EQ(count(errors, "spec.runtimeRef.name", "QLoRA is not supported for qwen2_5/1.5B model"), 1) << dump(errors);
  EXPECT_EQ(errors.size(), 1u) << dump(errors);
}

TEST(Validation, QloraOnSingleDeviceOnlyModelsNeedsOneProcess) {
  auto j = tune_job("torchtune-llama3.2-1b", kQlora);
  set_gpus(j, "2");
  const auto errors = validate(j, catalog());
  EXPECT_EQ(count(errors, "spec.trainer.numProcPerNode", "must be 1 for llama3_2/1B model when using QLoRA"), 1) << dump(errors);
  EXPECT_EQ(count(errors, "spec.trainer.resourcesPerNode", "must have gpu resource with value 1"), 1) << dump(errors);
  set_gpus(j, "1");
  EXPECT_TRUE(validate(j, catalog()).empty());
  // gemma2, mistral and llama3.1 8B ship only the single-device QLoRA config too.
  auto g = tune_job("torchtune-gemma2-2b", kQlora);  // runtime default: 2 GPUs
  EXPECT_EQ(count(validate(g, catalog()), "spec.trainer.numProcPerNode", "when using QLoRA"), 1);
}

TEST(Validation, QloraOnDistributedOnlyModelsNeedsMoreThanOneProcess) {
  auto j = tune_job("torchtune-llama3.3-70b", kQlora);
  set_gpus(j, "1");
  EXPECT_EQ(count(validate(j, catalog()), "spec.trainer.numProcPerNode", "must be more than 1 for llama3_3/70B"), 1);
  set_gpus(j, "8");
  EXPECT_TRUE(validate(j, catalog()).empty());
}

TEST(Validation, LoraWithMoreThanOneNodeIsRefused) {
  auto j = tune_job("torchtune-llama3.3-70b", kLora);
  j.spec.trainer->num_nodes = 2;
  const auto errors = validate(j, catalog());
  EXPECT_EQ(count(errors, "spec.trainer.numNodes", "LoRA fine-tuning is not supported for multi-node training"), 1)
      << dump(errors);
  EXPECT_EQ(errors.size(), 1u) << dump(errors);
}

TEST(Validation, OverridingARuntimeOwnedKeyIsRefused) {
  const auto errors = validate(tune_job("torchtune-qwen2.5-0.5b", {"epochs=1", "output_dir=/tmp/out", "~tokenizer.path",
                                                                   "tokenizer.merges_file=m.txt",
                                                                   "checkpointer.checkpoint_dir=/x",
                                                                   "checkpointer.output_dir=/fine"}),
                               catalog());
  EXPECT_EQ(count(errors, "spec.trainer.args[1]", "immutable config \"output_dir\""), 1) << dump(errors);
  EXPECT_EQ(count(errors, "spec.trainer.args[2]", "immutable config \"tokenizer.path\""), 1) << dump(errors);
  EXPECT_EQ(count(errors, "spec.trainer.args[3]", "immutable config \"tokenizer.merges_file\""), 1) << dump(errors);
  EXPECT_EQ(count(errors, "spec.trainer.args[4]", "immutable config \"checkpointer.checkpoint_dir\""), 1) << dump(errors);
  EXPECT_EQ(errors.size(), 4u) << "checkpointer.output_dir is the user's" << dump(errors);
}

TEST(Validation, BuiltinTrainerNeedsATorchtuneRuntime) {
  const auto errors = validate(tune_job("torch-distributed", {"epochs=1"}), catalog());
  EXPECT_EQ(count(errors, "spec.trainer.command", "a BuiltinTrainer (tune run) needs a runtime labelled"), 1) << dump(errors);
}

TEST(Validation, CustomTrainerCannotRunOnATorchtuneRuntime) {
  auto j = tune_job("torchtune-llama3.2-1b");
  j.spec.trainer->command = {"python", "train.py"};
  const auto errors = validate(j, catalog());
  EXPECT_EQ(count(errors, "spec.trainer.command", "a CustomTrainer (command python ...) cannot run on runtime"), 1)
      << dump(errors);
  auto empty = tune_job("torch-distributed");
  empty.spec.trainer->command.clear();
  EXPECT_EQ(count(validate(empty, catalog()), "spec.trainer.command", "gives the node no command"), 1);
}

TEST(Validation, ALayoutTorchtuneHasNoConfigForIsRefused) {
  auto j = tune_job("torchtune-gemma2-2b");
  set_gpus(j, "1");
  const auto errors = validate(j, catalog());
  EXPECT_EQ(count(errors, "spec.trainer.numProcPerNode", "there is no config gemma2/2B_full_single_device"), 1)
      << dump(errors);
  auto lora = tune_job("torchtune-llama3.1-70b", kLora);
  set_gpus(lora, "1");
  EXPECT_EQ(count(validate(lora, catalog()), "spec.trainer.numProcPerNode", "llama3_1/70B_lora_single_device"), 1);
}

TEST(Validation, NumProcPerNodeAndNumNodesMustBeSane) {
  auto j = tune_job("torchtune-llama3.2-1b");
  j.spec.trainer->num_proc_per_node = "many";
  EXPECT_EQ(count(validate(j, catalog()), "spec.trainer.numProcPerNode", "must be a positive integer or one of auto"), 1);
  j.spec.trainer->num_proc_per_node = "";
  j.spec.trainer->num_nodes = 0;
  EXPECT_EQ(count(validate(j, catalog()), "spec.trainer.numNodes", "must be at least 1"), 1);
}

TEST(Validation, InitializersNeedAKnownSchemeAndARuntimeJob) {
  auto j = tune_job("torchtune-llama3.2-1b");
  v1alpha1::Initializer init;
  init.dataset = v1alpha1::InitializerSpec{std::string("ftp://host/data"), {}, std::nullopt};
  init.model = v1alpha1::InitializerSpec{std::string("hf://just-an-org"), {}, std::nullopt};
  j.spec.initializer = init;
  auto errors = validate(j, catalog());
  EXPECT_EQ(count(errors, "spec.initializer.dataset.storageUri", "must start with hf://, s3:// or file://"), 1) << dump(errors);
  EXPECT_EQ(count(errors, "spec.initializer.model.storageUri", "must name a repository"), 1) << dump(errors);
  auto custom = tune_job("torch-distributed");
  custom.spec.trainer->command = {"python", "x.py"};
  init.dataset->storage_uri = "s3://b/p";
  init.model.reset();
  custom.spec.initializer = init;
  EXPECT_EQ(count(validate(custom, catalog()), "spec.initializer.dataset", "has no dataset-initializer job"), 1);
}

TEST(Validation, EveryProblemIsReportedAtOnce) {
  auto j = tune_job("torchtune-llama3.2-1b", {"model.lora_attn_modules=[q_proj]", "output_dir=/tmp"});
  j.metadata.name = "Bad_Name";
  j.spec.trainer->num_nodes = 3;
  j.spec.trainer->env = {{"PET_MASTER_PORT", std::string("1"), {}}};
  j.spec.runtime_ref.api_group = "kubeflow.org";
  const auto errors = validate(j, catalog());
  EXPECT_EQ(count(errors, "metadata.name", "RFC 1035"), 1);
  EXPECT_EQ(count(errors, "spec.runtimeRef.apiGroup", "trainer.kubeflow.org"), 1);
  EXPECT_EQ(count(errors, "spec.trainer.env[0].name", "PET_MASTER_PORT"), 1);
  EXPECT_EQ(count(errors, "spec.trainer.numNodes", "LoRA fine-tuning is not supported"), 1);
  EXPECT_EQ(count(errors, "spec.trainer.args[1]", "output_dir"), 1);
  EXPECT_EQ(errors.size(), 5u) << dump(errors);
  try {
    validate_or_throw(j, catalog());
    FAIL();
  } catch (const Errors& e) {
    EXPECT_EQ(e.errors().size(), 5u);
    const std::string text = e.what();
    EXPECT_EQ(text.rfind("5 errors", 0), 0u) << text;
    EXPECT_NE(text.find("spec.trainer.args[1]: must not set immutable config \"output_dir\""), std::string::npos) << text;
  }
}

TEST(Validation, KtunesBundledConfigsAreTheDefaultAndLiftRulesWhereTheConfigExists) {
  if (ConfigSet::bundled().empty()) GTEST_SKIP() << "the build found no configs/";
  const RuntimeCatalog ktune = RuntimeCatalog::builtin();
  EXPECT_EQ(ktune.configs().source(), "ktune configs/");
  // Same job, two trainer images: torchtune has no gemma2 single-device full config, ktune has.
  auto j = tune_job("torchtune-gemma2-2b");
  set_gpus(j, "1");
  ASSERT_TRUE(ConfigSet::bundled().contains("gemma2/2B_full_single_device"));
  EXPECT_EQ(validate(j, catalog()).size(), 1u);
  EXPECT_TRUE(validate(j, ktune).empty()) << dump(validate(j, ktune));
  // Where neither ships the config, the rule stands.
  auto multi = tune_job("torchtune-llama3.2-1b");
  multi.spec.trainer->num_nodes = 2;
  ASSERT_FALSE(ConfigSet::bundled().contains("llama3_2/1B_full_multinode"));
  EXPECT_EQ(count(validate(multi, ktune), "spec.trainer.numNodes", "(configs: ktune configs/)"), 1)
      << dump(validate(multi, ktune));
  // LoRA on more than one node is refused whatever the configs.
  auto lora = tune_job("torchtune-llama3.3-70b", kLora);
  lora.spec.trainer->num_nodes = 2;
  EXPECT_EQ(count(validate(lora, ktune), "spec.trainer.numNodes", "LoRA fine-tuning is not supported"), 1);
}

TEST(Validation, KtunesBundledConfigsCoverEveryTorchtuneFineTuneConfig) {
  if (ConfigSet::bundled().empty()) GTEST_SKIP() << "the build found no configs/";
  for (const std::string& model : supported_models())
    for (const TorchTuneConfigEntry& e : torchtune_configs(model)) {
      const bool finetune = e.recipe == "full_finetune_single_device" || e.recipe == "full_finetune_distributed" ||
                            e.recipe == "lora_finetune_single_device" || e.recipe == "lora_finetune_distributed";
      if (!finetune || e.config == "mistral/7B_full_low_memory") continue;  // ktune: mistral/7B_full_single_device
      EXPECT_TRUE(ConfigSet::bundled().contains(e.config)) << e.config << " is a torchtune config ktune lacks";
    }
  EXPECT_TRUE(ConfigSet::bundled().contains("mistral/7B_full_single_device"));
  EXPECT_EQ(select_recipe("mistral/7B", 1, 1, {}, ConfigSet::bundled()).config, "mistral/7B_full_single_device");
}

}  // namespace
}  // namespace ktune
