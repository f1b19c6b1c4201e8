// SDK call -> TrainJob: the TorchTuneConfig args, initializer env and resources compared with
// what the real upstream SDK renders (fixtures/sdk_torchtune_args.json, made by the script beside
// it), plus ktune's documented departures, the job name shape and the CustomTrainer command.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <tuple>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "core/error.h"
#include "runtime/plugins.h"
#include "runtime/trainjob_builder.h"
#include "runtime/validation.h"

namespace ktune {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

json load_fixture() {
  std::ifstream in(std::string(KTUNE_SOURCE_DIR) + "/tests/runtime/fixtures/sdk_torchtune_args.json");
  EXPECT_TRUE(in) << "fixture missing: run tests/runtime/fixtures/make_sdk_args.py";
  return in ? json::parse(in) : json::object();
}

types::TorchTuneConfig config_from(const json& c) {
  types::TorchTuneConfig cfg;
  if (c.contains("dtype")) cfg.dtype = types::data_type_from_string(c["dtype"]);
  if (c.contains("batch_size")) cfg.batch_size = c["batch_size"].get<int>();
  if (c.contains("epochs")) cfg.epochs = c["epochs"].get<int>();
  if (c.value("loss", false)) cfg.loss = types::Loss::CEWithChunkedOutputLoss;
  if (c.contains("num_nodes")) cfg.num_nodes = c["num_nodes"].get<int>();
  if (c.contains("peft")) {
    const json& p = c["peft"];
    types::LoraConfig l;
    if (p.contains("apply_lora_to_mlp")) l.apply_lora_to_mlp = p["apply_lora_to_mlp"].get<bool>();
    if (p.contains("apply_lora_to_output")) l.apply_lora_to_output = p["apply_lora_to_output"].get<bool>();
    if (p.contains("lora_attn_modules")) l.lora_attn_modules = p["lora_attn_modules"].get<std::vector<std::string>>();
    if (p.contains("lora_rank")) l.lora_rank = p["lora_rank"].get<int>();
    if (p.contains("lora_alpha")) l.lora_alpha = p["lora_alpha"].get<int>();
    if (p.contains("lora_dropout")) l.lora_dropout = p["lora_dropout"].get<double>();
    if (p.contains("quantize_base")) l.quantize_base = p["quantize_base"].get<bool>();
    if (p.contains("use_dora")) l.use_dora = p["use_dora"].get<bool>();
    cfg.peft_config = l;
  }
  if (c.contains("dataset")) {
    const json& d = c["dataset"];
    types::TorchTuneInstructDataset ds;
    if (d.contains("source")) ds.source = types::data_format_from_string(d["source"]);
    if (d.contains("split")) ds.split = d["split"].get<std::string>();
    if (d.contains("train_on_input")) ds.train_on_input = d["train_on_input"].get<bool>();
    if (d.contains("new_system_prompt")) ds.new_system_prompt = d["new_system_prompt"].get<std::string>();
    if (d.contains("column_map"))
      for (const auto& kv : d["column_map"]) ds.column_map.emplace_back(kv[0], kv[1]);
    cfg.dataset_preprocess_config = ds;
  }
  return cfg;
}

std::optional<std::vector<std::string>> opt_strings(const json& j, const char* key) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  return j[key].get<std::vector<std::string>>();
}
std::optional<std::string> opt_string(const json& j, const char* key) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  return j[key].get<std::string>();
}

types::Initializer initializer_from(const json& i) {
  types::Initializer init;
  if (i.contains("dataset")) {
    const json& d = i["dataset"];
    if (d["type"] == "hf") {
      types::HuggingFaceDatasetInitializer h{d["storage_uri"], opt_strings(d, "ignore_patterns"), opt_string(d, "access_token")};
      init.dataset = h;
    } else if (d["type"] == "cache") {
      types::DataCacheInitializer c;
      c.storage_uri = d["storage_uri"];
      c.metadata_loc = d["metadata_loc"];
      c.num_data_nodes = d["num_data_nodes"];
      c.head_cpu = opt_string(d, "head_cpu");
      c.head_mem = opt_string(d, "head_mem");
      c.worker_cpu = opt_string(d, "worker_cpu");
      c.worker_mem = opt_string(d, "worker_mem");
      c.iam_role = opt_string(d, "iam_role");
      init.dataset = c;
    } else {
      types::S3DatasetInitializer s;
      s.storage_uri = d["storage_uri"];
      s.ignore_patterns = opt_strings(d, "ignore_patterns");
      s.endpoint = opt_string(d, "endpoint");
      s.access_key_id = opt_string(d, "access_key_id");
      s.secret_access_key = opt_string(d, "secret_access_key");
      s.region = opt_string(d, "region");
      s.role_arn = opt_string(d, "role_arn");
      init.dataset = s;
    }
  }
  if (i.contains("model")) {
    const json& m = i["model"];
    if (m["type"] == "hf") {
      types::HuggingFaceModelInitializer h;
      h.storage_uri = m["storage_uri"];
      if (m.contains("ignore_patterns")) h.ignore_patterns = opt_strings(m, "ignore_patterns");
      h.access_token = opt_string(m, "access_token");
      init.model = h;
    } else {
      types::S3ModelInitializer s;
      s.storage_uri = m["storage_uri"];
      if (m.contains("ignore_patterns")) s.ignore_patterns = opt_strings(m, "ignore_patterns");
      init.model = s;
    }
  }
  return init;
}

TEST(TorchTuneArgs, MatchTheUpstreamSdkForEveryFixtureCase) {
  const json fixture = load_fixture();
  ASSERT_GE(fixture["args"].size(), 20u);
  for (const json& c : fixture["args"]) {
    const types::TorchTuneConfig cfg = config_from(c["config"]);
    std::optional<types::Initializer> init;
    if (!c["initializer"].is_null()) init = initializer_from(c["initializer"]);
    const auto got = torchtune_args(cfg, init ? &*init : nullptr, /*upstream_exact=*/true);
    EXPECT_EQ(got, c["args"].get<std::vector<std::string>>()) << c["name"] << " (" << fixture["sdk"] << ")";
  }
}

TEST(TorchTuneArgs, S3DatasetPointsAtTheWorkspaceUnlikeUpstream) {
  types::Initializer init;
  init.dataset = types::S3DatasetInitializer{"s3://bucket/data"};
  types::TorchTuneConfig cfg;
  cfg.epochs = 1;
  EXPECT_EQ(torchtune_args(cfg, &init, true), (std::vector<std::string>{"epochs=1"}));
  EXPECT_EQ(torchtune_args(cfg, &init), (std::vector<std::string>{"epochs=1", "dataset.data_dir=/workspace/dataset"}));
}

// The dataset initializer copies a file:// folder's contents into /workspace/dataset (and one file
// to /workspace/dataset/<name>): the location must point there, not at a path made of the source's
// own directories (the bug an hf://-style reading of file:///a/b/c gave: data_dir=/workspace/dataset/b/c).
TEST(TorchTuneArgs, FileDatasetPointsWhereTheInitializerCopiedIt) {
  types::TorchTuneConfig cfg;
  auto args_for = [&](const std::string& uri) {
    types::Initializer init;
    init.dataset = types::HuggingFaceDatasetInitializer{uri};
    return torchtune_args(cfg, &init);
  };
  EXPECT_EQ(args_for("file:///tmp/jobs/src/dataset"), (std::vector<std::string>{"dataset.data_dir=/workspace/dataset"}));
  EXPECT_EQ(args_for("file:///tmp/jobs/src/dataset/"), (std::vector<std::string>{"dataset.data_dir=/workspace/dataset"}));
  EXPECT_EQ(args_for("file:///data"), (std::vector<std::string>{"dataset.data_dir=/workspace/dataset"}));
  EXPECT_EQ(args_for("file:///tmp/src/train.jsonl"),
            (std::vector<std::string>{"dataset.data_files=/workspace/dataset/train.jsonl"}));
  EXPECT_EQ(args_for("file://relative/dir/rows.parquet"),
            (std::vector<std::string>{"dataset.data_files=/workspace/dataset/rows.parquet"}));
  // hf:// keeps upstream's rendering.
  EXPECT_EQ(args_for("hf://tatsu-lab/alpaca/data"), (std::vector<std::string>{"dataset.data_dir=/workspace/dataset/data"}));
}

TEST(TorchTuneArgs, ChatAndMultimodalDatasetsRenderTheirFieldsWhereUpstreamRefuses) {
  types::TorchTuneConfig cfg;
  types::TorchTuneChatDataset chat;
  chat.source = types::DataFormat::JSON;
  chat.conversation_column = "conversations";
  chat.conversation_style = "sharegpt";
  chat.train_on_input = false;
  cfg.dataset_preprocess_config = chat;
  EXPECT_EQ(torchtune_args(cfg, nullptr),
            (std::vector<std::string>{"dataset=torchtune.datasets.chat_dataset", "dataset.source=json",
                                      "dataset.conversation_column=conversations", "dataset.conversation_style=sharegpt",
                                      "dataset.train_on_input=False"}));
  EXPECT_THROW(torchtune_args(cfg, nullptr, true), Error);
  types::TorchTuneMultimodalDataset mm;
  mm.source = types::DataFormat::PARQUET;
  mm.column_map = {{"image", "img"}};
  mm.image_tag = "<image>";
  cfg.dataset_preprocess_config = mm;
  EXPECT_EQ(torchtune_args(cfg, nullptr),
            (std::vector<std::string>{"dataset=torchtune.datasets.multimodal.multimodal_chat_dataset",
                                      "dataset.source=parquet", "dataset.column_map={'image': 'img'}",
                                      "dataset.image_tag=<image>"}));
}

TEST(InitializerEnv, MatchesTheUpstreamSdk) {
  const json fixture = load_fixture();
  ASSERT_GE(fixture["initializers"].size(), 7u);
  for (const json& c : fixture["initializers"]) {
    const v1alpha1::Initializer got = trainjob_initializer(initializer_from(c["initializer"]));
    for (const char* kind : {"dataset", "model"}) {
      const auto& spec = std::string(kind) == "dataset" ? got.dataset : got.model;
      if (!c["rendered"].contains(kind)) {
        EXPECT_FALSE(spec) << c["name"];
        continue;
      }
      ASSERT_TRUE(spec) << c["name"];
      EXPECT_EQ(*spec->storage_uri, c["rendered"][kind]["storageUri"]) << c["name"];
      std::vector<std::pair<std::string, std::string>> env;
      for (const auto& e : spec->env) env.emplace_back(e.name, *e.value);
      std::vector<std::pair<std::string, std::string>> want;
      for (const auto& e : c["rendered"][kind]["env"]) want.emplace_back(e[0], e[1]);
      EXPECT_EQ(env, want) << c["name"];
    }
  }
}

TEST(InitializerEnv, BareHuggingFaceRepoGetsTheHfScheme) {
  types::Initializer init;
  init.dataset = types::HuggingFaceDatasetInitializer{"tatsu-lab/alpaca/data"};
  init.model = types::HuggingFaceModelInitializer{"meta-llama/Llama-3.2-1B-Instruct"};
  const v1alpha1::Initializer got = trainjob_initializer(init);
  EXPECT_EQ(*got.dataset->storage_uri, "hf://tatsu-lab/alpaca/data");
  EXPECT_EQ(*got.model->storage_uri, "hf://meta-llama/Llama-3.2-1B-Instruct");
  // A local path is not made a repo id (hf:///tmp/model would ask the Hub for "tmp/model"): refused,
  // with the file:// spelling the initializer copies.
  init.model = types::HuggingFaceModelInitializer{"/tmp/qa/model"};
  try {
    trainjob_initializer(init);
    FAIL() << "a local path accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "storage_uri '/tmp/qa/model': a local path, not a Hugging Face repo: write file:///tmp/qa/model for a "
              "folder the initializer copies");
  }
  init.model = types::HuggingFaceModelInitializer{"./model"};
  EXPECT_THROW(trainjob_initializer(init), Error);
}

TEST(ResourcesPerNode, MatchTheUpstreamSdkAliases) {
  const json fixture = load_fixture();
  ASSERT_GE(fixture["resources"].size(), 4u);
  for (const json& c : fixture["resources"]) {
    types::StringDict in;
    for (const auto& kv : c["input"]) in.emplace_back(kv[0], kv[1]);
    const v1alpha1::ResourceRequirements r = resources_per_node(in);
    for (const char* side : {"limits", "requests"}) {
      const auto& got = std::string(side) == "limits" ? r.limits : r.requests;
      std::set<std::string> want_keys, got_keys;
      for (auto it = c[side].begin(); it != c[side].end(); ++it) {
        want_keys.insert(it.key());
        ASSERT_TRUE(got.count(it.key())) << c["name"] << " " << it.key();
        // The SDK's Quantity model turns 2 into 2.0: compare the amounts.
        EXPECT_EQ(parse_quantity(got.at(it.key())), parse_quantity(it.value().get<std::string>()))
            << c["name"] << " " << it.key();
      }
      for (const auto& [k, v] : got) got_keys.insert(k);
      EXPECT_EQ(got_keys, want_keys) << c["name"];
    }
  }
}

TEST(ResourcesPerNode, GpuWithMigOrTwoMigKindsRefused) {
  EXPECT_THROW(resources_per_node({{"gpu", "1"}, {"mig-1g.5gb", "1"}}), Error);
  EXPECT_THROW(resources_per_node({{"mig-1g.5gb", "1"}, {"mig-2g.10gb", "1"}}), Error);
}

TEST(JobName, IsALetterAndElevenHexCharactersAndAValidName) {
  const std::regex shape("^[a-z][0-9a-f]{11}$");
  std::set<std::string> seen;
  for (int i = 0; i < 2000; ++i) {
    const std::string n = generate_job_name();
    ASSERT_TRUE(std::regex_match(n, shape)) << n;
    ASSERT_TRUE(is_rfc1035_label(n)) << n;
    seen.insert(n);
  }
  EXPECT_EQ(seen.size(), 2000u);
}

types::Runtime torchtune_runtime(const std::string& name) {
  types::Runtime rt;
  rt.name = name;
  rt.trainer.trainer_type = types::TrainerType::BuiltinTrainer;
  rt.trainer.framework = "torchtune";
  rt.trainer.command = {"tune", "run"};
  return rt;
}

TEST(MakeTrainJob, BuiltinTrainerBecomesTuneRunWithRenderedArgs) {
  types::BuiltinTrainer b;
  b.config.epochs = 2;
  b.config.num_nodes = 1;
  b.config.peft_config = types::LoraConfig{};
  b.config.resources_per_node = {{"gpu", "1"}};
  types::Initializer init;
  init.model = types::HuggingFaceModelInitializer{"hf://meta-llama/Llama-3.2-1B-Instruct"};
  const v1alpha1::TrainJob job = make_trainjob(torchtune_runtime("torchtune-llama3.2-1b"), &init, b, {.name = "my-job"});
  EXPECT_EQ(job.metadata.name, "my-job");
  EXPECT_EQ(job.spec.runtime_ref.name, "torchtune-llama3.2-1b");
  EXPECT_EQ(job.spec.runtime_ref.kind, "ClusterTrainingRuntime");
  ASSERT_TRUE(job.spec.trainer);
  EXPECT_EQ(job.spec.trainer->command, (std::vector<std::string>{"tune", "run"}));
  EXPECT_EQ(job.spec.trainer->args,
            (std::vector<std::string>{"epochs=2", "model.lora_attn_modules=[q_proj,v_proj,output_proj]"}));
  EXPECT_EQ(job.spec.trainer->num_nodes, 1);
  EXPECT_EQ(job.spec.trainer->resources_per_node->limits.at("nvidia.com/gpu"), "1");
  EXPECT_EQ(*job.spec.initializer->model->storage_uri, "hf://meta-llama/Llama-3.2-1B-Instruct");
  EXPECT_TRUE(std::regex_match(make_trainjob(torchtune_runtime("x"), nullptr, b).metadata.name,
                               std::regex("^[a-z][0-9a-f]{11}$")));
}

// Numbers the trainer would refuse, or the rendering would drop (a 0, as upstream's `if
// config.epochs:` does), are refused when the TrainJob is made, every one in one message.
TEST(MakeTrainJob, OutOfRangeNumbersAreRefusedTogetherBeforeTheJobIsMade) {
  types::BuiltinTrainer b;
  b.config.epochs = 0;
  b.config.batch_size = 0;
  types::LoraConfig lora;
  lora.lora_rank = 0;
  lora.lora_dropout = 2.0;
  b.config.peft_config = lora;
  try {
    make_trainjob(torchtune_runtime("torchtune-llama3.2-1b"), nullptr, b, {.name = "bad-job"});
    FAIL() << "expected an error";
  } catch (const Errors& e) {
    std::vector<std::string> got;
    for (const Error& one : e.errors()) got.push_back(one.where() + ": " + one.what_only());
    EXPECT_EQ(got, (std::vector<std::string>{
                       "trainer.config.batch_size: expected at least 1, got 0",
                       "trainer.config.epochs: expected at least 1, got 0",
                       "trainer.config.peft_config.lora_rank: expected at least 1, got 0",
                       "trainer.config.peft_config.lora_dropout: expected from 0 up to, not including, 1, got 2.0"}));
  }
  b.config.epochs = 1, b.config.batch_size = 2;
  b.config.peft_config->lora_rank = 8, b.config.peft_config->lora_dropout = 0.05;
  EXPECT_NO_THROW(make_trainjob(torchtune_runtime("torchtune-llama3.2-1b"), nullptr, b, {.name = "good-job"}));
}

// LoraConfig.lora_attn_modules names torchtune's attention projections only; an empty list would
// plan a full fine-tune (the list picks the LoRA recipe) that refuses the LoRA keys after the
// downloads. Both are refused by the call.
TEST(MakeTrainJob, LoraModulesOutsideTorchtunesAttentionProjectionsOrNoneAreRefused) {
  types::BuiltinTrainer b;
  types::LoraConfig lora;
  lora.lora_attn_modules = {"q_proj", "foo_proj", "gate_proj"};
  b.config.peft_config = lora;
  try {
    make_trainjob(torchtune_runtime("torchtune-llama3.2-1b"), nullptr, b, {.name = "bad-job"});
    FAIL() << "expected an error";
  } catch (const Errors& e) {
    ASSERT_EQ(e.errors().size(), 2u) << e.what();
    EXPECT_EQ(e.errors()[0].where(), "trainer.config.peft_config.lora_attn_modules");
    EXPECT_NE(e.errors()[0].what_only().find("'foo_proj' is not one of q_proj, k_proj, v_proj, output_proj"),
              std::string::npos) << e.what();
    EXPECT_NE(e.errors()[1].what_only().find("'gate_proj'"), std::string::npos) << e.what();
    EXPECT_NE(e.errors()[1].what_only().find("apply_lora_to_mlp"), std::string::npos) << e.what();
  }
  b.config.peft_config->lora_attn_modules = {};
  try {
    make_trainjob(torchtune_runtime("torchtune-llama3.2-1b"), nullptr, b, {.name = "bad-job"});
    FAIL() << "expected an error";
  } catch (const Errors& e) {
    EXPECT_NE(std::string(e.what()).find("lora_attn_modules: empty"), std::string::npos) << e.what();
  }
  b.config.peft_config->lora_attn_modules = {"k_proj", "output_proj"};
  EXPECT_NO_THROW(make_trainjob(torchtune_runtime("torchtune-llama3.2-1b"), nullptr, b, {.name = "good-job"}));
}

TEST(MakeTrainJob, CustomTrainerScriptIsEmbeddedAndStartedWithTheRuntimeEntrypoint) {
  types::Runtime rt;
  rt.name = "torch-distributed";
  rt.trainer.command = {"torchrun"};
  types::CustomTrainer c;
  c.script = "import torch\nprint('it''s', torch.__version__)";
  c.args = {"--lr", "1e-3"};
  c.packages_to_install = {"transformers[torch]"};
  c.env = {{"MY_FLAG", "1"}};
  c.num_nodes = 2;
  const v1alpha1::TrainJob job = make_trainjob(rt, nullptr, c, {.name = "custom"});
  const auto& cmd = job.spec.trainer->command;
  ASSERT_EQ(cmd.size(), 3u);
  EXPECT_EQ(cmd[0], "bash");
  EXPECT_EQ(cmd[1], "-c");
  EXPECT_NE(cmd[2].find(c.script), std::string::npos);
  EXPECT_NE(cmd[2].find("torchrun \"ktune_train.py\" '--lr' '1e-3'"), std::string::npos) << cmd[2];
  EXPECT_NE(cmd[2].find("'transformers[torch]'"), std::string::npos);
  EXPECT_EQ(job.spec.trainer->env.at(0).name, "MY_FLAG");
  EXPECT_EQ(job.spec.trainer->num_nodes, 2);

  types::CustomTrainer both = c;
  both.command = {"python", "x.py"};
  EXPECT_THROW(make_trainjob(rt, nullptr, both), Error);
  EXPECT_THROW(make_trainjob(rt, nullptr, types::CustomTrainer{}), Error);
}

// A function whose source holds a line "EOM" (in a string) is written to ktune_train.py whole: the
// here-document's marker is one no line of the script is (upstream's EOM ended it there and ran the
// rest as bash).
TEST(MakeTrainJob, CustomTrainerScriptWithAnEomLineIsWrittenWhole) {
  const fs::path dir = fs::temp_directory_path() / ("ktune_eom_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  types::Runtime rt;
  rt.name = "torch-distributed";
  rt.trainer.command = {"true"};
  types::CustomTrainer c;
  c.script = "text = \"\"\"\nEOM\necho INJECTED\nEOM_1\n\"\"\"\nprint(text, '$HOME `x`')";
  const std::string cmd = make_trainjob(rt, nullptr, c, {.name = "custom"}).spec.trainer->command.at(2);
  std::ofstream(dir / "job.sh") << cmd;
  FILE* p = ::popen(("cd " + dir.string() + " && bash job.sh 2>&1").c_str(), "r");
  std::string out;
  char buf[512];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  EXPECT_EQ(WEXITSTATUS(::pclose(p)), 0) << out;
  EXPECT_EQ(out.find("INJECTED"), std::string::npos) << out;
  std::ifstream written(dir / "ktune_train.py");
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(written)), {}), c.script);
  EXPECT_NE(cmd.find("<< 'EOM_2'"), std::string::npos) << cmd;
  fs::remove_all(dir);
}

// The function's script, run by bash with a `python` on PATH whose pip fails as asked: a --user
// install refused (a virtual environment's Python) falls back to a system-wide one; both refused
// stops the script with exit 1, pip's log on stderr, before the entrypoint starts.
TEST(MakeTrainJob, CustomTrainerPackagesInstallForTheUserElseSystemWideElseTheScriptStops) {
  const fs::path dir = fs::temp_directory_path() / ("ktune_pip_" + std::to_string(::getpid()));
  fs::create_directories(dir / "bin");
  {
    std::ofstream python(dir / "bin" / "python");  // records its arguments; fails --user or every install as told
    python << "#!/bin/bash\necho \"PIP_BREAK_SYSTEM_PACKAGES=$PIP_BREAK_SYSTEM_PACKAGES $*\" >> \"$CALLS\"\n"
              "case \"$FAIL:$*\" in all:*install*) echo 'pip: no index'; exit 1;; user:*--user*) echo 'pip: "
              "Can not perform a --user install'; exit 1;; esac\nexit 0\n";
  }
  fs::permissions(dir / "bin" / "python", fs::perms::owner_all);
  types::Runtime rt;
  rt.name = "torch-distributed";
  rt.trainer.command = {"echo", "started"};
  types::CustomTrainer c;
  c.script = "print('hi')";
  c.packages_to_install = {"transformers[torch]", "peft"};
  const std::string cmd = make_trainjob(rt, nullptr, c, {.name = "custom"}).spec.trainer->command.at(2);
  std::ofstream(dir / "job.sh") << cmd;  // what the pod's `bash -c` runs
  auto run = [&](const std::string& fail) {
    fs::remove(dir / "calls");
    const std::string line = "cd " + dir.string() + " && PATH=" + (dir / "bin").string() + ":/usr/bin:/bin CALLS=" +
                             (dir / "calls").string() + " FAIL=" + fail + " bash job.sh 2>&1";
    std::string out;
    FILE* p = ::popen(line.c_str(), "r");
    char buf[512];
    while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
    const int status = ::pclose(p);
    std::ifstream calls(dir / "calls");
    std::string recorded((std::istreambuf_iterator<char>(calls)), {});
    return std::tuple{WEXITSTATUS(status), out, recorded};
  };
  auto [rc, out, calls] = run("none");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("installed Python packages (user): transformers[torch] peft"), std::string::npos) << out;
  EXPECT_NE(out.find("started ktune_train.py"), std::string::npos) << out;
  EXPECT_NE(calls.find("PIP_BREAK_SYSTEM_PACKAGES=1 -m pip install --quiet --no-warn-script-location --index-url "
                       "https://pypi.org/simple --user transformers[torch] peft"), std::string::npos) << calls;
  std::tie(rc, out, calls) = run("user");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("installed Python packages (system-wide): transformers[torch] peft"), std::string::npos) << out;
  EXPECT_NE(out.find("started ktune_train.py"), std::string::npos) << out;
  std::tie(rc, out, calls) = run("all");
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("ERROR: failed to install Python packages: transformers[torch] peft"), std::string::npos) << out;
  EXPECT_NE(out.find("pip: no index"), std::string::npos) << out;
  EXPECT_EQ(out.find("started"), std::string::npos) << out;
  fs::remove_all(dir);
}

TEST(SecretEnv, TokensAndKeysAreSecret) {
  for (const char* n : {"ACCESS_TOKEN", "SECRET_ACCESS_KEY", "HF_TOKEN", "MY_PASSWORD", "AWS_SESSION_TOKEN"})
    EXPECT_TRUE(is_secret_env_name(n)) << n;
  for (const char* n : {"STORAGE_URI", "IGNORE_PATTERNS", "REGION", "ENDPOINT", "PET_NNODES"})
    EXPECT_FALSE(is_secret_env_name(n)) << n;
}

}  // namespace
}  // namespace ktune
