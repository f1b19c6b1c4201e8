// TrainerClient: upstream's wait errors, the SDK views of jobs, the runtimes table, and the
// end-to-end run of a BuiltinTrainer job on the local backend: planned by runtime/'s build_plan,
// run with a TEST TRAINER (tests/sdk/fake_tune.py stands in for `tune run` and for the
// initializers until ktune's trainer exists), logs followed, waited for, outputs found.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "sdk/trainer_client.h"
#include "sdk/trainer_config_check.h"
#include "test_home.h"

namespace ktune::sdk {
namespace {

using testing::local_config;
using testing::plan_of;
using testing::read_text;
using testing::shell_step;
using testing::TempHome;

const std::string kFakeTune = std::string(KTUNE_SOURCE_DIR) + "/tests/sdk/fake_tune.py";

TrainerClient client_for(const TempHome& home) {
  BackendConfig c = local_config(home.path());
  c.trainer_command = {"python3", kFakeTune, "run"};
  return TrainerClient(std::make_unique<LocalBackend>(c), RuntimeCatalog::builtin());
}

TEST(WaitForJobStatus, RefusesBadArgumentsAsUpstreamDoes) {
  TempHome home;
  TrainerClient client = client_for(home);
  std::string name = client.submit(plan_of({shell_step("node-0", "true", {}, 0)}));
  try {
    client.wait_for_job_status(name, {"Complete", "Done"});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Expected status {'Complete', 'Done'} must be a subset of"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(client.wait_for_job_status(name, {"Complete"}, 10, 0), Error);
  EXPECT_THROW(client.wait_for_job_status(name, {"Complete"}, 10, -1), Error);
  try {
    client.wait_for_job_status(name, {"Complete"}, 2, 2);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Polling interval must be strictly less than timeout"), std::string::npos);
  }
  try {
    client.wait_for_job_status(name, {"Complete"}, 0);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Timeout must be a positive number, got timeout=0"), std::string::npos) << e.what();
  }
  // Upstream's order: the times first (its API layer), then the statuses (its backend).
  try {
    client.wait_for_job_status(name, {"Done"}, -1);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Timeout must be a positive number"), std::string::npos) << e.what();
  }
  EXPECT_THROW(client.wait_for_job_status(name, {}, 10, 1), Error);  // a wait that could never end
  EXPECT_THROW(client.wait_for_job_status("nosuchjob000", {"Complete"}, 2, 0.1), Error);
  EXPECT_EQ(client.wait_for_job_status(name, {"Complete"}, 20, 0.05).status, "Complete");
}

TEST(WaitForJobStatus, AnUnexpectedFailureIsAnErrorButAnAwaitedOneIsNot) {
  TempHome home;
  TrainerClient client = client_for(home);
  std::string name = client.submit(plan_of({shell_step("node-0", "sleep 0.2; exit 5", {}, 0)}));
  try {
    client.wait_for_job_status(name, {"Complete"}, 20, 0.05);
    FAIL() << "a Failed job was waited for as if it could still Complete";
  } catch (const JobFailedError& e) {
    EXPECT_NE(std::string(e.what()).find("TrainJob " + name + " is Failed"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("exited with code 5"), std::string::npos) << e.what();
  }
  EXPECT_EQ(client.wait_for_job_status(name, {"Complete", "Failed"}, 5, 0.05).status, "Failed");
}

TEST(WaitForJobStatus, TimesOutAfterTheTimeoutAndCallsBackOnEveryPoll) {
  TempHome home;
  TrainerClient client = client_for(home);
  std::string name = client.submit(plan_of({shell_step("node-0", "sleep 30", {}, 0)}));
  int polls = 0;
  auto t0 = std::chrono::steady_clock::now();
  try {
    client.wait_for_job_status(name, {"Complete"}, 2, 0.1, [&](const types::TrainJob& j) {
      ++polls;
      EXPECT_TRUE(j.status == "Running" || j.status == "Created") << j.status;
    });
    FAIL();
  } catch (const WaitTimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("Timeout waiting for TrainJob " + name + " to reach status: {'Complete'}"),
              std::string::npos);
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(seconds, 2.0);
  EXPECT_LT(seconds, 10.0);  // a bound, not a timing: the wait ends near its timeout, not at the job's end
  EXPECT_GE(polls, 3);
  // Waiting for Running returns at once.
  EXPECT_EQ(client.wait_for_job_status(name, {"Running"}, 5, 0.1).status, "Running");
  client.delete_job(name);
}

TEST(TrainerClient, ShowsJobsAsUpstreamsTrainJobWithStepsAndDevices) {
  TempHome home;
  TrainerClient client = client_for(home);
  TrainJobPlan p = plan_of({shell_step("model-initializer", "true"), shell_step("node-0", "true", {"model-initializer"}, 0)},
                           "torchtune-llama3.2-1b");
  p.steps[1].num_proc = 2;
  std::string name = client.submit(p);
  types::TrainJob j = client.wait_for_job_status(name, {"Complete"}, 20, 0.05);
  EXPECT_EQ(j.name, name);
  EXPECT_EQ(j.runtime.name, "torchtune-llama3.2-1b");
  EXPECT_EQ(j.runtime.trainer.framework, "torchtune");  // resolved from the catalog
  EXPECT_TRUE(std::regex_match(j.creation_timestamp, std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)"))) << j.creation_timestamp;
  ASSERT_EQ(j.steps.size(), 2u);
  EXPECT_EQ(j.steps[1].name, "node-0");
  EXPECT_EQ(j.steps[1].status, "Complete");
  EXPECT_EQ(j.steps[1].device_count, "2");
  EXPECT_EQ(j.steps[1].pod_name, "node-0");  // no pod: the step's name, as upstream's local-process backend
  ASSERT_EQ(client.list_jobs().size(), 1u);
  EXPECT_EQ(client.list_jobs("torchtune-llama3.2-1b").size(), 1u);
  EXPECT_EQ(client.list_jobs("torchtune-qwen2.5-7b").size(), 0u);
}

TEST(TrainerClient, RuntimesTableHasTheDesignsColumns) {
  TempHome home;
  TrainerClient client = client_for(home);
  std::vector<types::Runtime> runtimes = client.list_runtimes();
  ASSERT_FALSE(runtimes.empty());
  std::string table = format_runtimes_table(runtimes);
  std::istringstream lines(table);
  std::string header;
  std::getline(lines, header);
  EXPECT_TRUE(std::regex_match(header, std::regex(
      "Runtime +Trainer Type +Framework +Pretrained Model +Accelerator +Count"))) << header;
  // Every column starts at the same offset on every row.
  const size_t framework_col = header.find("Framework");
  int rows = 0;
  for (std::string line; std::getline(lines, line); ++rows) {
    EXPECT_NE(line[framework_col], ' ') << line;
    EXPECT_EQ(line[framework_col - 1], ' ') << line;
  }
  EXPECT_EQ(rows, int(runtimes.size()));
  EXPECT_NE(table.find("torchtune-llama3.2-1b"), std::string::npos);
  EXPECT_NE(table.find("builtin-trainer"), std::string::npos);
  EXPECT_EQ(client.get_runtime("torchtune-llama3.2-1b").name, "torchtune-llama3.2-1b");
  EXPECT_THROW(client.get_runtime("torchtune-nonexistent-1b"), Error);
}

// Runtimes in <home>/runtimes join the builtin ones, and one of the same name replaces the builtin.
TEST(TrainerClient, RuntimesInTheHomeDirectoryAddToAndReplaceTheBuiltinOnes) {
  TempHome home;
  std::filesystem::create_directories(home.path() + "/runtimes/more");
  std::string yaml;
  for (const EmbeddedManifest& m : embedded_manifests())
    if (std::string(m.text).find("name: torchtune-llama3.2-1b\n") != std::string::npos) yaml = m.text;
  ASSERT_FALSE(yaml.empty());
  const std::string image = "ghcr.io/ktune/ktune-trainer:0.1.0";
  std::string replaced = yaml;
  for (size_t at; (at = replaced.find(image)) != std::string::npos;) replaced.replace(at, image.size(), "example.com/mine:1");
  std::ofstream(home.path() + "/runtimes/replaced.yaml") << replaced;
  std::string added = yaml;
  const std::string name_line = "name: torchtune-llama3.2-1b\n";
  added.replace(added.find(name_line), name_line.size(), "name: torchtune-llama3.2-9b\n");
  std::ofstream(home.path() + "/runtimes/more/added.yml") << added;
  BackendConfig config = local_config(home.path());
  TrainerClient client(config);
  EXPECT_EQ(client.get_runtime("torchtune-llama3.2-1b").trainer.image, "example.com/mine:1");
  EXPECT_EQ(client.get_runtime("torchtune-llama3.2-3b").trainer.image, image);
  EXPECT_EQ(client.get_runtime("torchtune-llama3.2-9b").trainer.image, image);
  EXPECT_EQ(client.list_runtimes().size(), TrainerClient(local_config(home.path() + "/none")).list_runtimes().size() + 1);
}

// A torchtune job's trainer config is checked by the built ktune (`ktune validate`) before the job
// starts: what the trainer would refuse on the node fails train() here, naming the key, and no job
// is made. A good job plans as before; without a checker (a replaced trainer) nothing runs.
TEST(TrainerClient, ChecksTheTrainersConfigBeforeTheJobStarts) {
  const std::string ktune = std::string(KTUNE_BINARY_DIR) + "/bin/ktune";
  if (!std::filesystem::exists(ktune)) GTEST_SKIP() << "needs the built ktune (" << ktune << ")";
  TempHome home;
  BackendConfig config = local_config(home.path());
  config.ktune_exe = ktune;
  TrainerClient client(config);
  EXPECT_EQ(client.trainer_config_checker(), ktune);
  const types::Runtime runtime = client.get_runtime("torchtune-llama3.2-1b");
  types::Initializer init;
  init.dataset = types::HuggingFaceDatasetInitializer{"hf://tatsu-lab/alpaca/data", std::nullopt, std::nullopt};
  types::HuggingFaceModelInitializer model;
  model.storage_uri = "hf://meta-llama/Llama-3.2-1B-Instruct";
  init.model = model;
  types::TorchTuneConfig cfg;
  cfg.peft_config = types::LoraConfig{};
  auto error_of = [&](const types::TorchTuneConfig& c) -> std::string {
    try {
      client.train(runtime, &init, types::BuiltinTrainer{c});
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  };

  // A good job: its plan carries the check's command, and the check passes.
  const TrainJobPlan plan = client.plan(runtime, &init, types::BuiltinTrainer{cfg});
  const std::optional<std::vector<std::string>> argv = trainer_config_check_command(plan, client.catalog(), ktune);
  ASSERT_TRUE(argv.has_value());
  ASSERT_GE(argv->size(), 6u);
  EXPECT_EQ(std::vector<std::string>(argv->begin(), argv->begin() + 5),
            (std::vector<std::string>{ktune, "validate", "llama3_2/1B_lora_single_device", "--recipe",
                                      "lora_finetune_single_device"}));
  EXPECT_NE(std::find(argv->begin(), argv->end(), "checkpointer.checkpoint_dir=/workspace/model"), argv->end());

  // The multimodal builder the SDK can name but the trainer lacks.
  types::TorchTuneConfig multimodal = cfg;
  multimodal.dataset_preprocess_config = types::TorchTuneMultimodalDataset{};
  std::string e = error_of(multimodal);
  EXPECT_NE(e.find("trainer config llama3_2/1B_lora_single_device"), std::string::npos) << e;
  EXPECT_NE(e.find("the trainer would refuse this job's config"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown dataset `torchtune.datasets.multimodal.multimodal_chat_dataset`"), std::string::npos) << e;
  // DataFormat.XML: a source no reader takes.
  types::TorchTuneConfig xml = cfg;
  types::TorchTuneInstructDataset instruct;
  instruct.source = types::DataFormat::XML;
  xml.dataset_preprocess_config = instruct;
  e = error_of(xml);
  EXPECT_NE(e.find("config key dataset.source"), std::string::npos) << e;
  EXPECT_NE(e.find("`xml` builder is not supported"), std::string::npos) << e;
  EXPECT_TRUE(client.list_jobs().empty());

  // A checker that cannot run is an error of its own, not a refused config.
  client.set_trainer_config_checker(home.path() + "/no-such-ktune");
  e = error_of(cfg);
  EXPECT_NE(e.find("no-such-ktune"), std::string::npos) << e;
  EXPECT_EQ(e.find("would refuse"), std::string::npos) << e;
  // No checker where the local trainer is replaced.
  config.trainer_command = {"python3", kFakeTune, "run"};
  EXPECT_EQ(TrainerClient(config).trainer_config_checker(), "");
}

// The end-to-end proof, with the test trainer standing in for `tune run`: submit a BuiltinTrainer
// LoRA job planned by build_plan, follow its logs, wait for Complete, find the outputs.
TEST(TrainerClientEndToEnd, BuiltinTrainerJobRunsLocallyWithTheTestTrainer) {
  TempHome home;
  TrainerClient client = client_for(home);
  const std::string token = "hf_e2eSecretToken123456";
  types::Initializer init;
  init.dataset = types::HuggingFaceDatasetInitializer{"hf://tatsu-lab/alpaca/data", std::nullopt, std::nullopt};
  types::HuggingFaceModelInitializer model;
  model.storage_uri = "hf://meta-llama/Llama-3.2-1B-Instruct";
  model.access_token = token;
  init.model = model;
  types::TorchTuneConfig cfg;
  cfg.dtype = types::DataType::BF16;
  cfg.batch_size = 2;
  cfg.epochs = 2;
  types::LoraConfig lora;
  lora.lora_rank = 8;
  lora.lora_alpha = 16;
  cfg.peft_config = lora;
  cfg.resources_per_node = {{"cpu", "1"}};
  const types::Runtime runtime = client.get_runtime("torchtune-llama3.2-1b");
  TrainJobPlan plan = client.plan(runtime, &init, types::BuiltinTrainer{cfg});
  ASSERT_EQ(plan.steps.size(), 3u) << plan.to_text();
  EXPECT_EQ(plan.recipe, "lora_finetune_single_device");
  EXPECT_EQ(plan.config, "llama3_2/1B_lora_single_device");
  // The hub's real initializers would download from Hugging Face (no network here): the test
  // initializer writes a tiny dataset and model instead; the node keeps the plan's own command,
  // only its `tune run` prefix becomes the test trainer.
  for (PlanStep& s : plan.steps)
    if (s.node_rank < 0) {
      const std::string kind = s.name.substr(0, s.name.find('-'));
      s.command = {"python3", kFakeTune, "initializer", kind};
      // Stored env must not hold the token, so the check gets it reversed.
      if (kind == "model") s.env["KTUNE_FAKE_EXPECT_TOKEN_REVERSED"] = std::string(token.rbegin(), token.rend());
    }
  std::string name = client.submit(plan);
  EXPECT_TRUE(std::regex_match(name, std::regex("^[a-z][0-9a-f]{11}$"))) << name;

  std::vector<std::string> lines;
  client.get_job_logs(name, "node-0", /*follow=*/true, [&](const std::string& l) {
    lines.push_back(l);
    return true;
  });
  types::TrainJob job = client.wait_for_job_status(name, {"Complete"}, 60, 0.1);
  TrainJobRecord record = client.get_job_record(name);
  ASSERT_EQ(job.status, "Complete") << record.reason;
  // 6 rows, batch 2, 2 epochs: 6 steps, each logged as torchtune does.
  int loss_lines = 0;
  for (const std::string& l : lines) loss_lines += std::regex_search(l, std::regex(R"(^\d\|\d+\|Loss: )"));
  EXPECT_EQ(loss_lines, 6);
  EXPECT_EQ(lines.back(), "INFO: training finished");
  // Progress reached the status.
  ASSERT_TRUE(job.progress.progress_percentage.has_value());
  EXPECT_EQ(*job.progress.progress_percentage, 100);
  EXPECT_EQ(job.progress.estimated_remaining_seconds.value_or(-1), 0);
  EXPECT_EQ(record.progress.step, 6);
  EXPECT_EQ(record.progress.total_steps, 6);
  // The outputs are in the job's workspace, where the plan's /workspace/output pointed.
  const std::string out = record.workspace + "/output";
  EXPECT_TRUE(std::filesystem::exists(out + "/epoch_0/adapter_model.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(out + "/epoch_1/adapter_model.safetensors"));
  nlohmann::json run = nlohmann::json::parse(read_text(out + "/fake_tune_run.json"));
  EXPECT_EQ(run["recipe"], plan.recipe);
  EXPECT_EQ(run["config"], plan.config);
  EXPECT_EQ(run["overrides"]["output_dir"], out);
  EXPECT_EQ(run["overrides"]["checkpointer.checkpoint_dir"], record.workspace + "/model");
  EXPECT_EQ(run["overrides"]["dataset.data_dir"], record.workspace + "/dataset/data");
  EXPECT_EQ(run["overrides"]["model.lora_rank"], "8");
  EXPECT_EQ(run["overrides"]["epochs"], "2");
  EXPECT_EQ(run["rows"], 6);
  EXPECT_EQ(run["env"]["PET_NODE_RANK"], "0");
  EXPECT_EQ(run["cwd"], record.workspace);
  // The access token reached the model initializer and nothing stored.
  EXPECT_EQ(record.step("model-initializer")->status, "Complete");
  for (const auto& entry : std::filesystem::recursive_directory_iterator(home.path()))
    if (entry.is_regular_file())
      EXPECT_EQ(read_text(entry.path().string()).find(token), std::string::npos) << entry.path();
}

}  // namespace
}  // namespace ktune::sdk
