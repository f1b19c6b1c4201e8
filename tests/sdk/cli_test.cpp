// The CLI over TrainerClient, run as a user runs it: the built `ktune` binary in a child process
// with a temporary KTUNE_HOME. The end-to-end job uses the hub's real initializers on file://
// sources and the TEST TRAINER (tests/sdk/fake_tune.py, via KTUNE_TRAINER_COMMAND) for the node,
// until ktune's own trainer exists.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "sdk/job_registry.h"
#include "sdk/process_identity.h"
#include "test_home.h"

namespace ktune::sdk {
namespace {

using testing::eventually;
using testing::read_text;
using testing::TempHome;

const std::string kKtune = std::string(KTUNE_BINARY_DIR) + "/bin/ktune";
const std::string kFakeTune = std::string(KTUNE_SOURCE_DIR) + "/tests/sdk/fake_tune.py";

struct Result {
  int code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

// Runs `ktune args...` with KTUNE_HOME=home and the extra env; captures stdout and stderr.
Result ktune(const TempHome& home, const std::string& args, const std::string& env = "") {
  const std::string out = home.path() + "/.stdout", err = home.path() + "/.stderr";
  const std::string cmd = "env KTUNE_HOME='" + home.path() + "' KTUNE_STOP_GRACE_SECONDS=2 " + env + " '" + kKtune +
                          "' " + args + " >'" + out + "' 2>'" + err + "'";
  Result r;
  int st = std::system(cmd.c_str());
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.out = read_text(out);
  r.err = read_text(err);
  return r;
}

// Each `ktune train <prefix> <flags> --dry-run` of the table exits 1 with its reason on stderr.
void expect_train_refused(const TempHome& home, const std::string& prefix,
                          const std::vector<std::pair<std::string, std::string>>& refused) {
  for (const auto& [flags, why] : refused) {
    Result r = ktune(home, "train " + prefix + " " + flags + " --dry-run");
    EXPECT_EQ(r.code, 1) << flags;
    EXPECT_NE(r.err.find(why), std::string::npos) << flags << ": " << r.err;
  }
}

std::string trainer_env(double step_seconds = 0.02) {
  return "KTUNE_TRAINER_COMMAND='python3 " + kFakeTune + " run' KTUNE_FAKE_STEP_SECONDS=" + std::to_string(step_seconds);
}

// A dataset folder and a model folder, served to the initializers as file:// sources. The dataset
// initializer copies the folder's contents into /workspace/dataset, and the control plane points
// dataset.data_dir there (TorchTuneArgs.FileDatasetPointsWhereTheInitializerCopiedIt).
void make_sources(const std::string& root) {
  std::filesystem::create_directories(root + "/dataset");
  std::ofstream(root + "/dataset/train.json")
      << R"([{"instruction":"a","input":"","output":"1"},{"instruction":"b","input":"","output":"2"},)"
      << R"({"instruction":"c","input":"","output":"3"},{"instruction":"d","input":"","output":"4"}])";
  std::filesystem::create_directories(root + "/model/original");
  std::ofstream(root + "/model/config.json") << R"({"model_type":"llama"})";
  std::ofstream(root + "/model/original/tokenizer.model") << "tokenizer";
}

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kKtune)) GTEST_SKIP() << "the ktune binary is not built at " << kKtune;
  }
  TempHome home;
};

TEST_F(Cli, RuntimesPrintsTheDesignsTable) {
  Result r = ktune(home, "runtimes");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("^Runtime +Trainer Type +Framework +Pretrained Model +Accelerator +Count\n")))
      << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("\ntorchtune-llama3.2-1b +builtin-trainer +torchtune ")));
  Result one = ktune(home, "runtimes torchtune-llama3.2-1b");
  ASSERT_EQ(one.code, 0) << one.err;
  EXPECT_NE(one.out.find("kind: ClusterTrainingRuntime"), std::string::npos);
  Result bad = ktune(home, "runtimes torchtune-nope-1b");
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.err.find("torchtune-llama3.2-1b"), std::string::npos) << bad.err;  // lists the available ones
}

TEST_F(Cli, TrainDryRunPrintsThePlanWithoutSecretsAndStartsNothing) {
  Result r = ktune(home,
                "train --runtime torchtune-llama3.2-1b --model hf://meta-llama/Llama-3.2-1B-Instruct "
                "--dataset hf://tatsu-lab/alpaca/data --lora-rank 8 --lora-alpha 16 --epochs 1 --dry-run",
                "HF_TOKEN=hf_dryRunSecret0123456789");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("lora_finetune"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("model.lora_rank=8"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("hf_dryRunSecret0123456789"), std::string::npos) << r.out;
  EXPECT_EQ(r.err.find("hf_dryRunSecret0123456789"), std::string::npos) << r.err;
  Result list = ktune(home, "jobs list");
  EXPECT_EQ(list.code, 0);
  EXPECT_EQ(list.out, "no TrainJobs\n");
}

TEST_F(Cli, TrainRefusesBadInputWithTheReason) {
  Result no_runtime = ktune(home, "train --epochs 1");
  EXPECT_EQ(no_runtime.code, 2);
  Result bad_runtime = ktune(home, "train --runtime torchtune-nope-1b");
  EXPECT_EQ(bad_runtime.code, 1);
  EXPECT_NE(bad_runtime.err.find("not found; available:"), std::string::npos) << bad_runtime.err;
  Result bad_int = ktune(home, "train --runtime torchtune-llama3.2-1b --epochs zero");
  EXPECT_EQ(bad_int.code, 1);
  EXPECT_NE(bad_int.err.find("--epochs"), std::string::npos);
  Result bad_dtype = ktune(home, "train --runtime torchtune-llama3.2-1b --dtype fp16");
  EXPECT_EQ(bad_dtype.code, 1);
  EXPECT_NE(bad_dtype.err.find("bf16 or fp32"), std::string::npos);
}

// The trainer, LoRA, dataset and initializer flags fill the SDK's shapes one flag a field: the
// plan's node command carries what upstream's SDK would render for the same TorchTuneConfig.
TEST_F(Cli, TrainFlagsFillTheSdksShapes) {
  Result qlora = ktune(home,
                       "train --runtime torchtune-llama3.2-1b --model hf://meta-llama/Llama-3.2-1B-Instruct "
                       "--model-ignore-patterns '*.bin,*.pt' --dataset hf://org/qa --quantize-base --lora-rank 16 "
                       "--lora-dropout 0.05 --lora-attn-modules q_proj,k_proj,v_proj --apply-lora-to-mlp "
                       "--apply-lora-to-output=false --dataset-format json --split 'train[:90%]' --train-on-input "
                       "--column-map input=question --column-map output=answer --resources memory=16Gi --dry-run");
  ASSERT_EQ(qlora.code, 0) << qlora.err;
  for (const char* part : {"config    llama3_2/1B_qlora_single_device", "IGNORE_PATTERNS=*.bin,*.pt",
                           "model.apply_lora_to_mlp=True", "model.apply_lora_to_output=False", "model.lora_rank=16",
                           "model.lora_dropout=0.05", "model.quantize_base=True",
                           "'model.lora_attn_modules=[q_proj,k_proj,v_proj]'", "dataset=torchtune.datasets.instruct_dataset",
                           "dataset.source=json", "'dataset.split=train[:90%]'", "dataset.train_on_input=True",
                           "'dataset.column_map={'\\''input'\\'': '\\''question'\\'', '\\''output'\\'': '\\''answer'\\''}'"})
    EXPECT_NE(qlora.out.find(part), std::string::npos) << part << " not in:\n" << qlora.out;

  // A chat dataset, DoRA, and two GPUs a node: the distributed LoRA recipe with two processes.
  Result chat = ktune(home,
                      "train --runtime torchtune-llama3.2-1b --model hf://m/m --dataset hf://org/chat --use-dora "
                      "--conversation-column messages --conversation-style openai --dataset-format json "
                      "--new-system-prompt 'Be brief.' --train-on-input=false --resources gpu=2 --dry-run");
  ASSERT_EQ(chat.code, 0) << chat.err;
  for (const char* part : {"recipe    lora_finetune_distributed", "layout    1 node x 2 processes", "model.use_dora=True",
                           "dataset=torchtune.datasets.chat_dataset", "dataset.conversation_column=messages",
                           "dataset.conversation_style=openai", "dataset.train_on_input=False",
                           "'dataset.new_system_prompt=Be brief.'"})
    EXPECT_NE(chat.out.find(part), std::string::npos) << part << " not in:\n" << chat.out;

  // What the trainer would refuse fails before anything starts: a chat dataset without its format.
  Result no_format = ktune(home, "train --runtime torchtune-llama3.2-1b --model hf://m/m --dataset hf://org/chat "
                                 "--conversation-column messages --conversation-style openai --dry-run");
  EXPECT_EQ(no_format.code, 1);
  EXPECT_NE(no_format.err.find("the trainer would refuse this job's config"), std::string::npos) << no_format.err;
  EXPECT_NE(no_format.err.find("config key dataset.source: missing"), std::string::npos) << no_format.err;

  expect_train_refused(home, "--runtime torchtune-llama3.2-1b --model hf://m/m", {
      {"--conversation-style alpaca", "expects sharegpt or openai"},
      {"--lora-dropout 1.5", "expects a probability in [0, 1)"},
      {"--column-map question", "expects KEY=VALUE"},
      {"--lora-attn-modules q_proj,,v_proj", "without empty items"},
      {"--dataset-format xml", "`xml` builder is not supported"},
      {"--dataset-format yaml", "expects json, csv, parquet, arrow or text"},
      {"--use-dora=maybe", "expects true or false"},
      {"--conversation-column messages --column-map input=q", "is an instruct dataset's"},
  });
  Result no_model = ktune(home, "train --runtime torchtune-llama3.2-1b --model-ignore-patterns '*.bin' --dry-run");
  EXPECT_EQ(no_model.code, 1);
  EXPECT_NE(no_model.err.find("give --model URI too"), std::string::npos) << no_model.err;
  EXPECT_EQ(ktune(home, "jobs list").out, "no TrainJobs\n");
}

// A CustomTrainer from the shell: a command (run locally to its end) or a script (run with the
// runtime's entrypoint), its env, packages and index; --image makes a CustomTrainerContainer. The
// torchtune trainer's flags do not mix in.
TEST_F(Cli, TrainRunsACustomTrainersCommandOrScript) {
  Result run = ktune(home, "train --runtime torch-distributed --command python3 --command -c "
                           "--command 'import os; print(\"custom\", os.environ[\"GREETING\"])' --env GREETING=hello --wait");
  ASSERT_EQ(run.code, 0) << run.err;
  const std::string job = run.out.substr(0, run.out.find('\n'));
  EXPECT_NE(run.err.find("(CustomTrainer)"), std::string::npos) << run.err;
  Result logs = ktune(home, "jobs logs " + job);
  EXPECT_NE(logs.out.find("custom hello"), std::string::npos) << logs.out << logs.err;

  std::ofstream(home.path() + "/train.py") << "print('from the script')\n";
  Result script = ktune(home, "train --runtime torch-distributed --script '" + home.path() + "/train.py' --arg --lr "
                              "--arg 0.1 --packages numpy,einops --pip-index-url https://mirror.example/simple "
                              "--num-nodes 2 --resources cpu=2 --dry-run");
  ASSERT_EQ(script.code, 0) << script.err;
  for (const char* part : {"(CustomTrainer, torch)", "2 nodes x", "from the script", "numpy", "einops",
                           "https://mirror.example/simple", "--lr"})
    EXPECT_NE(script.out.find(part), std::string::npos) << part << " not in:\n" << script.out;
  // The index a cluster's pip mirror sets for the SDK serves the shell too (DEFAULT_PIP_INDEX_URLS).
  Result mirrored = ktune(home, "train --runtime torch-distributed --script '" + home.path() + "/train.py' --packages numpy "
                                "--dry-run", "DEFAULT_PIP_INDEX_URLS=https://pip.internal/simple");
  ASSERT_EQ(mirrored.code, 0) << mirrored.err;
  EXPECT_NE(mirrored.out.find("https://pip.internal/simple"), std::string::npos) << mirrored.out;
  EXPECT_EQ(mirrored.out.find("https://pypi.org/simple"), std::string::npos) << mirrored.out;

  Result container = ktune(home, "train --runtime torch-distributed --image registry.example/train:1 --env A=1 --dry-run");
  ASSERT_EQ(container.code, 0) << container.err;  // planned (the YAML a cluster would get); run only on one:
  EXPECT_NE(container.out.find("registry.example/train:1"), std::string::npos) << container.out;
  Result local_image = ktune(home, "train --runtime torch-distributed --image registry.example/train:1");
  EXPECT_EQ(local_image.code, 1);
  EXPECT_NE(local_image.err.find("CustomTrainerContainer"), std::string::npos) << local_image.err;

  expect_train_refused(home, "--runtime torch-distributed", {
      {"--command python3 --epochs 2", "do not mix with the torchtune trainer's"},
      {"--script /nonexistent/train.py", "cannot read the script"},
      {"--env A=1", "a --script FILE or a --command, one of the two"},
      {"--image r/i:1 --command python3", "runs its image's own program"},
      {"--image r/i:1 --arg --lr", "runs its image's own program"},
      {"--command python3 --packages numpy", "a --command runs as given"},
  });
}

// Submit, follow, list, get, logs, wait, delete: the whole lifecycle from the shell.
TEST_F(Cli, EndToEndJobWithRealInitializersAndTheTestTrainer) {
  make_sources(home.path() + "/src");
  const std::string uris = " --model file://" + home.path() + "/src/model --dataset file://" + home.path() + "/src/dataset";
  Result train = ktune(home, "train --runtime torchtune-llama3.2-1b" + uris + " --epochs 2 --batch-size 2 --follow",
                    trainer_env());
  ASSERT_EQ(train.code, 0) << train.out << train.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(train.out, m, std::regex("^([a-z][0-9a-f]{11})\n"))) << train.out;
  const std::string name = m[1];
  // --follow streamed node-0: 4 rows, batch 2, 2 epochs = 4 steps.
  const std::regex loss_line(R"(\n\d\|\d+\|Loss: )");
  EXPECT_EQ(std::distance(std::sregex_iterator(train.out.begin(), train.out.end(), loss_line), std::sregex_iterator()), 4)
      << train.out;
  EXPECT_NE(train.err.find("TrainJob " + name + " Complete"), std::string::npos) << train.err;

  Result list = ktune(home, "jobs list");
  ASSERT_EQ(list.code, 0) << list.err;
  EXPECT_TRUE(std::regex_search(list.out, std::regex(name + " +Complete +torchtune-llama3.2-1b +3/3 +100% \\(4/4\\)"))) << list.out;

  Result get = ktune(home, "jobs get " + name);
  ASSERT_EQ(get.code, 0) << get.err;
  EXPECT_NE(get.out.find("Status:      Complete"), std::string::npos) << get.out;
  EXPECT_NE(get.out.find("Progress:    100% (4/4)"), std::string::npos) << get.out;
  EXPECT_NE(get.out.find("loss="), std::string::npos) << get.out;
  EXPECT_TRUE(std::regex_search(get.out, std::regex("\nnode-0 +Complete +cpu +1 +[0-9]+ +0 "))) << get.out;

  Result init_logs = ktune(home, "jobs logs " + name + " --step dataset-initializer");
  ASSERT_EQ(init_logs.code, 0) << init_logs.err;
  EXPECT_NE(init_logs.out.find("dataset-initializer"), std::string::npos) << init_logs.out;

  Result wait = ktune(home, "jobs wait " + name + " --timeout 5");
  EXPECT_EQ(wait.code, 0) << wait.err;
  EXPECT_EQ(wait.out, name + " Complete\n");

  const std::string ws = home.path() + "/jobs/" + name;
  EXPECT_TRUE(std::filesystem::exists(ws + "/output/epoch_1/adapter_model.safetensors"));
  EXPECT_EQ(read_text(ws + "/dataset/train.json"), read_text(home.path() + "/src/dataset/train.json"));

  Result del = ktune(home, "jobs delete " + name + " --workspace");
  EXPECT_EQ(del.code, 0) << del.err;
  EXPECT_FALSE(std::filesystem::exists(ws));
  EXPECT_EQ(ktune(home, "jobs get " + name).code, 1);
}

TEST_F(Cli, WaitExitCodesSayFailedAndTimeout) {
  make_sources(home.path() + "/src");
  // A dataset that is not JSON: the test trainer exits 3 reading it.
  std::ofstream(home.path() + "/src/dataset/train.json") << "not json";
  const std::string uris = " --model file://" + home.path() + "/src/model --dataset file://" + home.path() + "/src/dataset";
  Result train = ktune(home, "train --runtime torchtune-llama3.2-1b" + uris + " --name failing-job", trainer_env());
  ASSERT_EQ(train.code, 0) << train.err;
  EXPECT_EQ(train.out, "failing-job\n");
  Result wait = ktune(home, "jobs wait failing-job --timeout 60 --interval 0.1");
  EXPECT_EQ(wait.code, 1) << wait.out << wait.err;
  EXPECT_NE(wait.err.find("TrainJob failing-job is Failed"), std::string::npos) << wait.err;
  // Waiting for Failed itself succeeds.
  EXPECT_EQ(ktune(home, "jobs wait failing-job --status Failed --timeout 5 --interval 0.1").code, 0);

  make_sources(home.path() + "/src2");
  const std::string slow = " --model file://" + home.path() + "/src2/model --dataset file://" + home.path() + "/src2/dataset";
  Result started = ktune(home, "train --runtime torchtune-llama3.2-1b" + slow + " --name slow-job", trainer_env(30));
  ASSERT_EQ(started.code, 0) << started.err;
  Result timeout = ktune(home, "jobs wait slow-job --timeout 0.5 --interval 0.1");
  EXPECT_EQ(timeout.code, 3) << timeout.err;
  EXPECT_NE(timeout.err.find("Timeout waiting for TrainJob slow-job"), std::string::npos);
  Result bad = ktune(home, "jobs wait slow-job --status Done --timeout 1");
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.err.find("must be a subset of"), std::string::npos);
  EXPECT_EQ(ktune(home, "jobs delete slow-job").code, 0);
}

TEST_F(Cli, AKilledSupervisorShowsAsFailedFromTheNextShell) {
  make_sources(home.path() + "/src");
  const std::string uris = " --model file://" + home.path() + "/src/model --dataset file://" + home.path() + "/src/dataset";
  Result train = ktune(home, "train --runtime torchtune-llama3.2-1b" + uris + " --name crash-job", trainer_env(30));
  ASSERT_EQ(train.code, 0) << train.err;
  JobRegistry registry(home.path() + "/registry.db");
  ASSERT_TRUE(eventually([&] { return registry.find("crash-job")->step("node-0")->status == kRunning; }, 30));
  TrainJobRecord job = *registry.find("crash-job");
  ASSERT_EQ(kill(job.supervisor_pid, SIGKILL), 0);
  ASSERT_TRUE(eventually([&] { return !process_is_alive(job.supervisor_pid, job.supervisor_start_time); }, 5));
  Result get = ktune(home, "jobs get crash-job");
  ASSERT_EQ(get.code, 0) << get.err;
  EXPECT_NE(get.out.find("Status:      Failed  (the job's supervisor (pid " + std::to_string(job.supervisor_pid)), std::string::npos)
      << get.out;
  EXPECT_TRUE(eventually([&] { return !process_is_alive(job.step("node-0")->pid, 0); }, 5));
  EXPECT_EQ(ktune(home, "jobs delete crash-job").code, 0);
}

}  // namespace
}  // namespace ktune::sdk
