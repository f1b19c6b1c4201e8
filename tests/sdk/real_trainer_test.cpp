// The end-to-end proof with ktune's own trainer: TrainerClient (in process) and `ktune train` (the
// CLI, a child process) submit a BuiltinTrainer LoRA fine-tune of the quickstart's tiny model to the
// local backend. The model and the dataset come through the hub's real file:// initializers, the
// node runs the real `ktune run lora_finetune_single_device --config llama3_2/1B_lora_single_device`
// as the runtime spells it, and the test checks the job's status, logs, progress and outputs (the
// merged model and the PEFT adapter in <workspace>/output/epoch_0).
//
// The tiny model (examples/quickstart, random weights from `ktune init-model`) ships a tokenizer.json
// rather than Llama 3's original/tokenizer.model, so the test installs its own copy of the
// torchtune-llama3.2-1b runtime in $KTUNE_HOME/runtimes whose tokenizer.path says so: that is also
// the proof that a runtime there replaces the builtin one. Nor is it Llama 3.2 1B's shape, which the
// config's lora_llama3_2_1b builder refuses (as torchtune's does), so the node's `tune run` is this
// ktune with one override more, model=ktune.models.lora_hf_model (the architecture from config.json),
// through a two-line trainer script (BackendConfig::trainer_command, KTUNE_TRAINER_COMMAND).
// Labelled slow (a few seconds a job; it runs the whole engine). It does not check what the model
// learns (tests/train does).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <regex>

#include <nlohmann/json.hpp>

#include "runtime/runtime_catalog.h"
#include "sdk/trainer_client.h"
#include "test_home.h"

namespace ktune::sdk {
namespace {

namespace fs = std::filesystem;
using testing::read_text;
using testing::TempHome;

const std::string kSource = KTUNE_SOURCE_DIR;
const std::string kKtune = std::string(KTUNE_BINARY_DIR) + "/bin/ktune";

int run_shell(const std::string& cmd) {
  const int st = std::system(cmd.c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

// The safetensors header of `path`: {tensor name: {dtype, shape, data_offsets}} (and __metadata__).
nlohmann::json safetensors_header(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);  // little-endian u64, as this machine
  if (!in || n == 0 || n > (1u << 24)) return nullptr;
  std::string text(n, '\0');
  in.read(text.data(), std::streamsize(n));
  return nlohmann::json::parse(text);
}

class RealTrainer : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kKtune)) GTEST_SKIP() << "the ktune binary is not built at " << kKtune;
    src_ = home_.path() + "/src";
    // The tiny model: random weights (seed 0) from the quickstart's config, its tokenizer beside it.
    ASSERT_EQ(run_shell("'" + kKtune + "' init-model --config '" + kSource + "/examples/quickstart/config.json'" +
                        " --output-dir '" + src_ + "/model' --seed 0 --copy '" + kSource +
                        "/examples/quickstart/tokenizer.json' --copy '" + kSource +
                        "/examples/quickstart/tokenizer_config.json' >/dev/null 2>&1"),
              0);
    // A dataset folder as the Hub's parquet layout has it (train and validation files; split=train).
    fs::create_directories(src_ + "/dataset");
    for (const char* f : {"train-00000-of-00001.parquet", "validation-00000-of-00001.parquet"})
      fs::copy_file(kSource + "/data/quickstart/data/" + f, src_ + "/dataset/" + f);
    // The runtime: the builtin torchtune-llama3.2-1b with the tiny model's tokenizer path.
    std::string yaml;
    for (const EmbeddedManifest& m : embedded_manifests())
      if (std::string(m.text).find("name: torchtune-llama3.2-1b\n") != std::string::npos) yaml = m.text;
    ASSERT_FALSE(yaml.empty());
    const std::string from = "tokenizer.path=/workspace/model/original/tokenizer.model";
    const size_t at = yaml.find(from);
    ASSERT_NE(at, std::string::npos);
    yaml.replace(at, from.size(), "tokenizer.path=/workspace/model/tokenizer.json");
    fs::create_directories(home_.path() + "/runtimes");
    std::ofstream(home_.path() + "/runtimes/torchtune-llama3.2-1b.yaml") << yaml;
    // `tune run ARGS` on the node: this ktune, the tiny model's builder after the plan's overrides.
    trainer_ = home_.path() + "/tiny_trainer.sh";
    std::ofstream(trainer_) << "#!/bin/sh\nexec '" << kKtune << "' run \"$@\" model=ktune.models.lora_hf_model\n";
    fs::permissions(trainer_, fs::perms::owner_all);
    // The tiny model trains fastest on one thread (its GEMMs are too small for a parallel region).
    setenv("KTUNE_NUM_THREADS", "1", 1);
  }
  void TearDown() override { unsetenv("KTUNE_NUM_THREADS"); }

  // The outputs of a LoRA job: the merged model (sharded as torchtune names it, with its index) and
  // the PEFT adapter with rank-`rank` A/B matrices on every targeted projection of the 4 layers.
  void expect_lora_outputs(const std::string& out, int rank, int alpha) {
    const std::string dir = out + "/epoch_0";
    ASSERT_TRUE(fs::is_directory(dir)) << dir;
    const nlohmann::json index = nlohmann::json::parse(read_text(dir + "/model.safetensors.index.json"));
    std::set<std::string> shards;
    for (const auto& [name, file] : index["weight_map"].items()) shards.insert(file.get<std::string>());
    ASSERT_FALSE(shards.empty());
    for (const std::string& f : shards) {
      const nlohmann::json h = safetensors_header(dir + "/" + f);
      ASSERT_TRUE(h.is_object()) << f;
      EXPECT_TRUE(h.contains("model.layers.0.self_attn.q_proj.weight")) << f;
      for (const auto& [name, t] : h.items())
        if (name != "__metadata__") {
          EXPECT_EQ(name.find("lora"), std::string::npos) << "merged model holds " << name;
        }
    }
    const nlohmann::json config = nlohmann::json::parse(read_text(dir + "/adapter_config.json"));
    EXPECT_EQ(config["r"], rank);
    EXPECT_EQ(config["lora_alpha"], alpha);
    EXPECT_EQ(config["peft_type"], "LORA");
    const nlohmann::json adapter = safetensors_header(dir + "/adapter_model.safetensors");
    ASSERT_TRUE(adapter.is_object());
    int a = 0, b = 0;
    for (const auto& [name, t] : adapter.items()) {
      if (name == "__metadata__") continue;
      if (name.find("lora_A") != std::string::npos) {
        ++a;
        EXPECT_EQ(t["shape"][0], rank) << name;
      } else if (name.find("lora_B") != std::string::npos) {
        ++b;
        EXPECT_EQ(t["shape"][1], rank) << name;
      }
    }
    // q_proj, v_proj, o_proj (the runtime's [q_proj,v_proj,output_proj]) + gate/up/down (apply_lora_to_mlp), 4 layers.
    EXPECT_EQ(a, 4 * 6);
    EXPECT_EQ(b, 4 * 6);
  }

  TempHome home_;
  std::string src_;
  std::string trainer_;  // the node's trainer: ktune run with the tiny model's builder
};

TEST_F(RealTrainer, TrainerClientRunsALoraFineTuneOfTheTinyModelThroughFileInitializers) {
  BackendConfig config;
  config.home = home_.path();
  config.ktune_exe = kKtune;  // supervises the job
  config.trainer_command = {trainer_};  // stands for `tune run`
  config.stop_grace_seconds = 2;
  TrainerClient client(config);

  types::Initializer init;
  init.dataset = types::HuggingFaceDatasetInitializer{"file://" + src_ + "/dataset", std::nullopt, std::nullopt};
  init.model = types::HuggingFaceModelInitializer{"file://" + src_ + "/model", std::nullopt, std::nullopt};
  types::TorchTuneConfig cfg;
  cfg.dtype = types::DataType::FP32;
  cfg.batch_size = 8;
  cfg.epochs = 1;
  types::LoraConfig lora;
  lora.lora_rank = 4;
  lora.lora_alpha = 8;
  lora.lora_attn_modules = {"q_proj", "v_proj", "output_proj"};
  cfg.peft_config = lora;
  const types::Runtime runtime = client.get_runtime("torchtune-llama3.2-1b");
  const TrainJobPlan plan = client.plan(runtime, &init, types::BuiltinTrainer{cfg});
  EXPECT_EQ(plan.recipe, "lora_finetune_single_device");
  EXPECT_EQ(plan.config, "llama3_2/1B_lora_single_device");
  const std::vector<std::string>& node = plan.steps.back().command;
  // Where the dataset initializer copies a file:// folder, and the runtime's tokenizer path.
  EXPECT_NE(std::find(node.begin(), node.end(), "dataset.data_dir=/workspace/dataset"), node.end()) << plan.to_text();
  EXPECT_NE(std::find(node.begin(), node.end(), "tokenizer.path=/workspace/model/tokenizer.json"), node.end());

  const std::string name = client.submit(plan);
  std::vector<std::string> lines;
  client.get_job_logs(name, "node-0", /*follow=*/true, [&](const std::string& l) {
    lines.push_back(l);
    return true;
  });
  const types::TrainJob job = client.wait_for_job_status(name, {types::kTrainJobComplete}, 300, 0.2);
  const TrainJobRecord record = client.get_job_record(name);
  ASSERT_EQ(job.status, "Complete") << record.reason << "\n" << read_text(record.workspace + "/logs/node-0.log");

  // 320 rows, batch 8, the config's gradient_accumulation_steps 8: 5 optimizer steps, one line each.
  int loss_lines = 0;
  for (const std::string& l : lines) loss_lines += std::regex_search(l, std::regex(R"(^1\|[1-5]\|Loss: \d+\.\d+)"));
  EXPECT_EQ(loss_lines, 5) << ::testing::PrintToString(lines);
  const std::string log = read_text(record.workspace + "/logs/node-0.log");
  EXPECT_NE(log.find("dataset: 320 samples"), std::string::npos) << log;
  EXPECT_NE(log.find("saved checkpoint"), std::string::npos) << log;

  ASSERT_TRUE(job.progress.progress_percentage.has_value());
  EXPECT_EQ(*job.progress.progress_percentage, 100);
  EXPECT_EQ(record.progress.step, 5);
  EXPECT_EQ(record.progress.total_steps, 5);
  EXPECT_TRUE(record.progress.metrics.count("loss"));
  for (const StepRecord& s : record.steps) EXPECT_EQ(s.exit_code, 0) << s.name;

  // The initializers put the sources where the plan said; the trainer wrote under /workspace/output.
  EXPECT_TRUE(fs::exists(record.workspace + "/dataset/train-00000-of-00001.parquet"));
  EXPECT_TRUE(fs::exists(record.workspace + "/model/model.safetensors"));
  expect_lora_outputs(record.workspace + "/output", 4, 8);

  // The SDK ships the adapter (TrainerClient::export_job) and the job records it.
  const std::string dest = home_.path() + "/sdk-export";
  ExportRequest request;
  request.destination = "file://" + dest;
  request.parts = hub::ExportParts::Adapter;
  std::vector<std::string> export_log;
  const ExportRecord exported = client.export_job(name, request, [&](const std::string& l) {
    export_log.push_back(l);
    return true;
  });
  EXPECT_EQ(exported.status, kComplete);
  EXPECT_EQ(nlohmann::json::parse(exported.summary_json).at("checkpoint"), "epoch_0");
  EXPECT_TRUE(fs::exists(dest + "/adapter_model.safetensors"));
  EXPECT_TRUE(fs::exists(dest + "/adapter_config.json"));
  EXPECT_EQ(export_log.size(), 2u) << ::testing::PrintToString(export_log);  // a line per file
  request.epoch = 7;
  EXPECT_THROW(client.export_job(name, request), Error);
  // A caller ends a local export mid-copy (a notebook's Ctrl-C): what while_waiting throws reaches it.
  struct Interrupted : std::runtime_error {
    Interrupted() : std::runtime_error("interrupted by the caller") {}
  };
  request.epoch = -1;
  request.destination = "file://" + dest + "-interrupted";
  request.while_waiting = [] { throw Interrupted(); };
  EXPECT_THROW(client.export_job(name, request), Interrupted);
  EXPECT_FALSE(fs::exists(dest + "-interrupted/adapter_model.safetensors"));
  const TrainJobRecord with_exports = client.get_job_record(name);
  ASSERT_EQ(with_exports.exports.size(), 3u);
  EXPECT_EQ(with_exports.exports[0].status, kComplete);
  EXPECT_EQ(with_exports.exports[1].status, kFailed);
  EXPECT_NE(with_exports.exports[1].error.find("epoch_7"), std::string::npos) << with_exports.exports[1].error;
  EXPECT_EQ(with_exports.exports[2].status, kFailed);
  EXPECT_EQ(with_exports.exports[2].error, "interrupted by the caller");

  client.delete_job(name, /*remove_workspace=*/true);
  EXPECT_FALSE(fs::exists(record.workspace));
}

// The same from the shell, with a single-file file:// dataset (JSON lines): its location becomes
// dataset.data_files=/workspace/dataset/<name> and its format (json) is read from the extension.
TEST_F(RealTrainer, KtuneTrainCliRunsTheSameJobWithASingleFileDataset) {
  std::ifstream rows(kSource + "/data/quickstart/jsonl/train.jsonl");
  std::ofstream file(src_ + "/rows.jsonl");
  std::string line;
  for (int i = 0; i < 128 && std::getline(rows, line); ++i) file << line << "\n";
  file.close();

  const std::string out = home_.path() + "/.stdout", err = home_.path() + "/.stderr";
  const std::string env =
      "env KTUNE_HOME='" + home_.path() + "' KTUNE_EXE='" + kKtune + "' KTUNE_TRAINER_COMMAND='" + trainer_ + "' ";
  const std::string train = env + "'" + kKtune + "' train --runtime torchtune-llama3.2-1b --model file://" + src_ +
                            "/model --dataset file://" + src_ + "/rows.jsonl --lora-rank 8 --lora-alpha 16 " +
                            "--epochs 1 --batch-size 8 --dtype fp32 --name cli-real --follow";
  ASSERT_EQ(run_shell(train + " --dry-run >'" + out + "' 2>'" + err + "'"), 0) << read_text(err);
  const std::string dry = read_text(out);
  EXPECT_NE(dry.find("dataset.source=json"), std::string::npos) << dry;
  EXPECT_NE(dry.find("dataset.data_files=/workspace/dataset/rows.jsonl"), std::string::npos) << dry;
  EXPECT_EQ(dry.find("dataset.source=parquet"), std::string::npos) << dry;

  ASSERT_EQ(run_shell(train + " >'" + out + "' 2>'" + err + "'"), 0) << read_text(out) << read_text(err);
  const std::string followed = read_text(out);
  EXPECT_EQ(followed.rfind("cli-real\n", 0), 0u) << followed;
  // 128 rows, batch 8, accumulation 8: 2 steps.
  const std::regex loss_line(R"(\n1\|[12]\|Loss: )");
  EXPECT_EQ(std::distance(std::sregex_iterator(followed.begin(), followed.end(), loss_line), std::sregex_iterator()), 2)
      << followed;
  EXPECT_NE(read_text(err).find("TrainJob cli-real Complete"), std::string::npos) << read_text(err);

  ASSERT_EQ(run_shell(env + "'" + kKtune + "' jobs get cli-real >'" + out + "' 2>'" + err + "'"), 0) << read_text(err);
  const std::string get = read_text(out);
  EXPECT_NE(get.find("Status:      Complete"), std::string::npos) << get;
  EXPECT_NE(get.find("Progress:    100% (2/2)"), std::string::npos) << get;
  EXPECT_TRUE(std::regex_search(get, std::regex("\nnode-0 +Complete +cpu +1 +[0-9]+ +0 "))) << get;
  EXPECT_TRUE(fs::exists(home_.path() + "/jobs/cli-real/dataset/rows.jsonl"));
  expect_lora_outputs(home_.path() + "/jobs/cli-real/output", 8, 16);

  // The exporter copies the adapter to a file:// destination and records it in the job's status;
  // a failing export is recorded as Failed with its reason.
  const std::string dest = home_.path() + "/exported";
  ASSERT_EQ(run_shell(env + "'" + kKtune + "' export --job cli-real --to file://" + dest + " --parts adapter >'" + out +
                      "' 2>'" + err + "'"),
            0)
      << read_text(err);
  EXPECT_TRUE(fs::exists(dest + "/adapter_model.safetensors"));
  EXPECT_TRUE(fs::exists(dest + "/adapter_config.json"));
  EXPECT_FALSE(fs::exists(dest + "/model.safetensors.index.json"));
  EXPECT_NE(run_shell(env + "'" + kKtune + "' export --job cli-real --to file://" + dest + "2 --epoch 7 >/dev/null 2>&1"), 0);
  ASSERT_EQ(run_shell(env + "'" + kKtune + "' jobs get cli-real >'" + out + "' 2>'" + err + "'"), 0) << read_text(err);
  const std::string exported = read_text(out);
  EXPECT_TRUE(std::regex_search(exported, std::regex("\n1 +Complete +adapter +2 +[0-9]+ +[^ ]+ +file://" + dest + "\n")))
      << exported;
  EXPECT_TRUE(std::regex_search(exported, std::regex("\n2 +Failed [(].*epoch_7.*[)] +available "))) << exported;
  EXPECT_EQ(run_shell(env + "'" + kKtune + "' jobs delete cli-real --workspace >/dev/null 2>&1"), 0);
}

}  // namespace
}  // namespace ktune::sdk
