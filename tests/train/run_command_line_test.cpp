// `ktune run` command line: launcher args before the recipe (both spellings, both forms), the
// PET_* environment, --config anywhere after the recipe, overrides kept in order, all errors.
#include <gtest/gtest.h>

#include <map>

#include "core/error.h"
#include "train/run_command_line.h"

using ktune::train::EnvLookup;
using ktune::train::parse_run_command_line;
using ktune::train::RunCommandLine;

namespace {
EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}
RunCommandLine parse(const std::vector<std::string>& args, std::map<std::string, std::string> env = {}) {
  return parse_run_command_line(args, env_of(std::move(env)));
}
std::string errors_of(const std::vector<std::string>& args, std::map<std::string, std::string> env = {}) {
  try {
    parse(args, std::move(env));
  } catch (const ktune::Errors& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(RunCommandLine, PlainSingleDeviceRun) {
  RunCommandLine r = parse({"lora_finetune_single_device", "--config", "llama3_2/1B_lora_single_device",
                            "batch_size=2", "~profiler.output_dir"});
  EXPECT_EQ(r.recipe, "lora_finetune_single_device");
  EXPECT_EQ(r.config, "llama3_2/1B_lora_single_device");
  EXPECT_EQ(r.overrides, (std::vector<std::string>{"batch_size=2", "~profiler.output_dir"}));
  EXPECT_FALSE(r.distributed_launch());
  EXPECT_EQ(r.launcher.nnodes_max, 1);
  EXPECT_TRUE(r.launcher.given.empty());
}

TEST(RunCommandLine, UpstreamRuntimeNodeCommand) {
  RunCommandLine r = parse({"--rdzv_endpoint=localhost:29500", "full_finetune_distributed", "--config",
                            "llama3_2/1B_full", "dataset=torchtune.datasets.instruct_dataset", "dataset.source=parquet",
                            "dataset.data_dir=/workspace/dataset/data", "output_dir=/workspace/output",
                            "tokenizer.path=/workspace/model/original/tokenizer.model",
                            "checkpointer.checkpoint_dir=/workspace/model"},
                           {{"PET_NNODES", "1"}, {"PET_NPROC_PER_NODE", "4"}, {"PET_NODE_RANK", "0"}});
  EXPECT_EQ(r.launcher.rdzv_endpoint, "localhost:29500");
  EXPECT_EQ(r.launcher.nproc_count(), 4);
  EXPECT_EQ(r.overrides.size(), 6u);
  EXPECT_TRUE(r.distributed_launch());
}

TEST(RunCommandLine, LauncherArgsInBothSpellingsAndForms) {
  RunCommandLine r = parse({"--nnodes", "2", "--nproc-per-node=8", "--node_rank", "1", "--master_addr=10.0.0.1",
                            "--master-port", "29400", "--rdzv-endpoint", "host-0:29500", "full_finetune_distributed",
                            "--config=llama3_3/70B_full_multinode"});
  EXPECT_EQ(r.launcher.nnodes_min, 2);
  EXPECT_EQ(r.launcher.nnodes_max, 2);
  EXPECT_EQ(r.launcher.nproc_per_node, "8");
  EXPECT_EQ(r.launcher.node_rank, 1);
  EXPECT_EQ(r.launcher.master_addr, "10.0.0.1");
  EXPECT_EQ(r.launcher.master_port, 29400);
  EXPECT_EQ(r.launcher.rdzv_endpoint, "host-0:29500");
  EXPECT_EQ(r.config, "llama3_3/70B_full_multinode");
  EXPECT_TRUE(r.distributed_launch());
}

TEST(RunCommandLine, PetEnvironmentIsReadAndCommandLineWins) {
  RunCommandLine r = parse({"--nproc_per_node", "2", "lora_finetune_distributed", "--config", "x.yaml"},
                           {{"PET_NNODES", "3"}, {"PET_NPROC_PER_NODE", "8"}, {"PET_NODE_RANK", "2"},
                            {"PET_MASTER_ADDR", "job-node-0-0.job"}, {"PET_MASTER_PORT", "29501"}});
  EXPECT_EQ(r.launcher.nnodes_max, 3);
  EXPECT_EQ(r.launcher.nproc_per_node, "2");  // the flag beats PET_NPROC_PER_NODE
  EXPECT_EQ(r.launcher.node_rank, 2);
  EXPECT_EQ(r.launcher.master_addr, "job-node-0-0.job");
  EXPECT_EQ(r.launcher.master_port, 29501);
  EXPECT_EQ(r.launcher.given.size(), 5u);
}

TEST(RunCommandLine, StandaloneElasticNnodesAndAutoNproc) {
  RunCommandLine r = parse({"--standalone", "--nnodes=1:4", "--nproc_per_node=auto", "full_finetune_distributed",
                            "--config", "c.yaml"});
  EXPECT_TRUE(r.launcher.standalone);
  EXPECT_EQ(r.launcher.nnodes_min, 1);
  EXPECT_EQ(r.launcher.nnodes_max, 4);
  EXPECT_FALSE(r.launcher.nproc_count().has_value());
  EXPECT_TRUE(r.distributed_launch());
}

TEST(RunCommandLine, ConfigMayComeAfterOverrides) {
  RunCommandLine r = parse({"lora_finetune_single_device", "epochs=2", "--config", "c.yaml", "batch_size=1"});
  EXPECT_EQ(r.config, "c.yaml");
  EXPECT_EQ(r.overrides, (std::vector<std::string>{"epochs=2", "batch_size=1"}));
}

TEST(RunCommandLine, ErrorsAreAllReportedWithTheirArgument) {
  std::string m = errors_of({"--nnodes=0", "--nproc_per_node=x", "--master_port=70000", "--nprocs=2",
                             "lora_finetune_single_device", "--verbose", "--config", "a", "--config", "b"});
  EXPECT_NE(m.find("6 errors"), std::string::npos) << m;
  EXPECT_NE(m.find("--nnodes=0: expected a node count"), std::string::npos) << m;
  EXPECT_NE(m.find("--nproc_per_node=x: expected a process count"), std::string::npos) << m;
  EXPECT_NE(m.find("--master_port=70000: expected a port"), std::string::npos) << m;
  EXPECT_NE(m.find("--nprocs=2: unknown launcher option"), std::string::npos) << m;
  EXPECT_NE(m.find("--verbose: additional flag arguments are not supported"), std::string::npos) << m;
  EXPECT_NE(m.find("given twice"), std::string::npos) << m;
}

TEST(RunCommandLine, MissingPiecesAreNamed) {
  EXPECT_NE(errors_of({}).find("missing RECIPE"), std::string::npos);
  EXPECT_NE(errors_of({"lora_finetune_single_device"}).find("--config NAME|FILE is required"), std::string::npos);
  EXPECT_NE(errors_of({"--config", "x", "lora_finetune_single_device"}).find("comes after the recipe"), std::string::npos);
  EXPECT_NE(errors_of({"my_recipe.py", "--config", "x"}).find("a Python recipe file cannot run"), std::string::npos);
  EXPECT_NE(errors_of({"--nnodes", "2", "--node_rank", "2", "r", "--config", "c"}).find("not below --nnodes 2"),
            std::string::npos);
  EXPECT_NE(errors_of({"r", "--config", "c"}, {{"PET_NODE_RANK", "-1"}}).find("PET_NODE_RANK: expected a node rank"),
            std::string::npos);
  EXPECT_NE(errors_of({"--nnodes"}).find("--nnodes: needs a value"), std::string::npos);
}
