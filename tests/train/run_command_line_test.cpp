// `ktune run` command line: launcher args before the recipe (both spellings, both forms), the
// PET_* environment, --config anywhere after the recipe, overrides kept in order, all errors.
#include <gtest/gtest.h>

#include <map>

#include "core/error.h"
#include "train/run_command_line.h"

using ktune::train::parse_run_command_line;
using ktune::train::RunCommandLine;

namespace {
RunCommandLine parse(const std::vector<std::string>& args, std::map<std::string, std::string> env = {}) {
  return parse_run_command_line(args, ktune::dist::environment_of(std::move(env)));
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
  EXPECT_FALSE(r.launch.launches_workers());
  EXPECT_EQ(r.launch.world_size(), 1);
}

TEST(RunCommandLine, UpstreamRuntimeNodeCommand) {
  RunCommandLine r = parse({"--rdzv_endpoint=localhost:29500", "full_finetune_distributed", "--config",
                            "llama3_2/1B_full", "dataset=torchtune.datasets.instruct_dataset", "dataset.source=parquet",
                            "dataset.data_dir=/workspace/dataset/data", "output_dir=/workspace/output",
                            "tokenizer.path=/workspace/model/original/tokenizer.model",
                            "checkpointer.checkpoint_dir=/workspace/model"},
                           {{"PET_NNODES", "1"}, {"PET_NPROC_PER_NODE", "4"}, {"PET_NODE_RANK", "0"}});
  EXPECT_EQ(r.launch.rdzv_endpoint, "localhost:29500");
  EXPECT_EQ(r.launch.nproc_per_node, 4);
  EXPECT_EQ(r.overrides.size(), 6u);
  EXPECT_TRUE(r.launch.launches_workers());
}

TEST(RunCommandLine, LauncherArgsInBothSpellingsAndForms) {
  RunCommandLine r = parse({"--nnodes", "2", "--nproc-per-node=8", "--node_rank", "1", "--master_addr=10.0.0.1",
                            "--master-port", "29400", "--rdzv-endpoint", "host-0:29500", "full_finetune_distributed",
                            "--config=llama3_3/70B_full_multinode"});
  EXPECT_EQ(r.launch.nnodes, 2);
  EXPECT_EQ(r.launch.nproc_per_node, 8);
  EXPECT_EQ(r.launch.node_rank, 1);
  EXPECT_EQ(r.launch.rdzv_endpoint, "host-0:29500");
  EXPECT_EQ(r.launch.master_addr, "host-0");  // the endpoint is the rendezvous address
  EXPECT_EQ(r.launch.master_port, 29500);
  EXPECT_EQ(r.config, "llama3_3/70B_full_multinode");
  EXPECT_TRUE(r.launch.launches_workers());
}

TEST(RunCommandLine, PetEnvironmentIsReadAndCommandLineWins) {
  RunCommandLine r = parse({"--nproc_per_node", "2", "lora_finetune_distributed", "--config", "x.yaml"},
                           {{"PET_NNODES", "3"}, {"PET_NPROC_PER_NODE", "8"}, {"PET_NODE_RANK", "2"},
                            {"PET_MASTER_ADDR", "job-node-0-0.job"}, {"PET_MASTER_PORT", "29501"}});
  EXPECT_EQ(r.launch.nnodes, 3);
  EXPECT_EQ(r.launch.nproc_per_node, 2);  // the flag beats PET_NPROC_PER_NODE
  EXPECT_EQ(r.launch.node_rank, 2);
  EXPECT_EQ(r.launch.master_addr, "job-node-0-0.job");
  EXPECT_EQ(r.launch.master_port, 29501);
}

TEST(RunCommandLine, StandaloneAndAutoNproc) {
  RunCommandLine r = parse({"--standalone", "--nnodes=1:1", "--nproc_per_node=auto", "full_finetune_distributed",
                            "--config", "c.yaml"});
  EXPECT_TRUE(r.launch.standalone);
  EXPECT_EQ(r.launch.nnodes, 1);
  EXPECT_EQ(r.launch.nproc_per_node, ktune::dist::auto_nproc_per_node());
  EXPECT_TRUE(r.launch.launches_workers());
}

TEST(RunCommandLine, NnodesNColonNIsOneCount) {
  RunCommandLine r = parse({"--nnodes", "2:2", "--node_rank=1", "full_finetune_distributed", "--config", "c.yaml"});
  EXPECT_EQ(r.launch.nnodes, 2);
  EXPECT_EQ(r.launch.node_rank, 1);
  EXPECT_EQ(r.launch.world_size(), 2);
}

// The review's case: `--nnodes 1:4` was taken as 4 nodes to decide on a launch and as 1 node for
// the plan. Now it is refused before anything starts, in the flag's form and in PET_NNODES's.
TEST(RunCommandLine, AnElasticNnodesRangeIsRefusedAsFlagOrEnv) {
  std::string flag = errors_of({"--nnodes", "1:4", "full_finetune_distributed", "--config", "c.yaml"});
  EXPECT_NE(flag.find("--nnodes: `1:4` is an elastic range (MIN:MAX); elastic node ranges are not supported"),
            std::string::npos) << flag;
  std::string eq = errors_of({"--nnodes=1:4", "full_finetune_distributed", "--config", "c.yaml"});
  EXPECT_NE(eq.find("--nnodes=1:4: `1:4` is an elastic range"), std::string::npos) << eq;
  std::string env = errors_of({"--rdzv_endpoint=localhost:29500", "full_finetune_distributed", "--config", "c.yaml"},
                              {{"PET_NNODES", "1:4"}, {"PET_NPROC_PER_NODE", "2"}, {"PET_NODE_RANK", "0"}});
  EXPECT_NE(env.find("env PET_NNODES: `1:4` is an elastic range"), std::string::npos) << env;
  EXPECT_NE(env.find("mlPolicy.torch.elasticPolicy"), std::string::npos) << env;
}

// The command line's plan is dist::resolve_launch_plan's, for every way an option can be given:
// the worker-launch decision and the plan cannot disagree, since there is one of each.
TEST(RunCommandLine, ThePlanIsTheLaunchersForEveryFlagAndEnvCombination) {
  using ktune::dist::LaunchPlan;
  struct Case {
    std::vector<std::string> flags;  // before the recipe
    std::map<std::string, std::string> env;
    ktune::dist::LauncherArgs args;  // the same flags, as resolve_launch_plan takes them
  };
  std::vector<Case> cases = {
      {{}, {}, {}},
      {{"--nnodes", "2:2"}, {}, {{"nnodes", {"2:2", "--nnodes"}}}},
      {{}, {{"PET_NNODES", "3"}, {"PET_NODE_RANK", "2"}}, {}},
      {{"--nproc-per-node=auto"}, {}, {{"nproc_per_node", {"auto", "--nproc-per-node=auto"}}}},
      {{}, {{"PET_NPROC_PER_NODE", "cpu"}}, {}},
      {{"--nproc_per_node=1"}, {{"PET_NPROC_PER_NODE", "8"}}, {{"nproc_per_node", {"1", "--nproc_per_node=1"}}}},
      {{}, {{"GROUP_RANK", "1"}, {"NNODES", "2"}, {"MASTER_ADDR", "10.1.1.1"}}, {}},
      {{"--standalone"}, {{"PET_MASTER_ADDR", "job-node-0-0.job"}}, {{"standalone", {"1", "--standalone"}}}},
      {{"--rdzv_endpoint=localhost:29500"},
       {{"PET_NNODES", "1"}, {"PET_NPROC_PER_NODE", "1"}, {"PET_NODE_RANK", "0"}},
       {{"rdzv_endpoint", {"localhost:29500", "--rdzv_endpoint=localhost:29500"}}}},
      {{"--master_addr", "10.0.0.1", "--master-port=29400"},
       {{"PET_NNODES", "2"}, {"PET_NODE_RANK", "1"}},
       {{"master_addr", {"10.0.0.1", "--master_addr"}}, {"master_port", {"29400", "--master-port=29400"}}}},
  };
  for (const Case& c : cases) {
    std::vector<std::string> argv = c.flags;
    argv.insert(argv.end(), {"full_finetune_distributed", "--config", "c.yaml"});
    LaunchPlan from_run = parse(argv, c.env).launch;
    LaunchPlan direct = ktune::dist::resolve_launch_plan(c.args, ktune::dist::environment_of(c.env));
    std::string label = ::testing::PrintToString(c.flags) + " " + ::testing::PrintToString(c.env);
    EXPECT_EQ(from_run.nnodes, direct.nnodes) << label;
    EXPECT_EQ(from_run.nproc_per_node, direct.nproc_per_node) << label;
    EXPECT_EQ(from_run.node_rank, direct.node_rank) << label;
    EXPECT_EQ(from_run.master_addr, direct.master_addr) << label;
    EXPECT_EQ(from_run.master_port, direct.master_port) << label;
    EXPECT_EQ(from_run.standalone, direct.standalone) << label;
    EXPECT_EQ(from_run.rdzv_endpoint, direct.rdzv_endpoint) << label;
    EXPECT_EQ(from_run.launches_workers(), direct.launches_workers()) << label;
  }
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
  EXPECT_NE(errors_of({"r", "--config", "c"}, {{"PET_NODE_RANK", "-1"}}).find("env PET_NODE_RANK: expected a node rank"),
            std::string::npos);
  EXPECT_NE(errors_of({"--nnodes"}).find("--nnodes: needs a value"), std::string::npos);
}
