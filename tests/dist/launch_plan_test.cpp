// The launch plan: each launcher option from its flag, else its PET_* variable, else torchrun's
// default, with one rule per option (launch_plan.h) and every problem named by its flag or variable.
#include "dist/launch_plan.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <map>

#include "core/error.h"

using namespace ktune;
using namespace ktune::dist;

namespace {

// Flags as `ktune run` gives them: canonical name → value, the argument text "--name=value".
LauncherArgs flags(std::map<std::string, std::string> values) {
  LauncherArgs args;
  for (const auto& [name, value] : values) args[name] = {value, "--" + name + "=" + value};
  return args;
}

LaunchPlan plan_of(std::map<std::string, std::string> flag_values, std::map<std::string, std::string> env = {}) {
  return resolve_launch_plan(flags(std::move(flag_values)), environment_of(std::move(env)));
}

std::string errors_of(std::map<std::string, std::string> flag_values, std::map<std::string, std::string> env = {}) {
  try {
    plan_of(std::move(flag_values), std::move(env));
  } catch (const Errors& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(LaunchPlan, DefaultsAreOneProcessWithoutALaunch) {
  LaunchPlan plan = plan_of({});
  EXPECT_EQ(plan.nnodes, 1);
  EXPECT_EQ(plan.nproc_per_node, 1);
  EXPECT_EQ(plan.node_rank, 0);
  EXPECT_EQ(plan.master_addr, "127.0.0.1");
  EXPECT_EQ(plan.master_port, 0);  // a free port, as torchtune's `tune run` without --rdzv_endpoint
  EXPECT_EQ(plan.rdzv_backend, "static");
  EXPECT_EQ(plan.rdzv_id, "none");
  EXPECT_FALSE(plan.launches_workers());
}

TEST(LaunchPlan, ReadsKubeflowsPetEnvAndTheRdzvEndpoint) {
  LaunchPlan plan = plan_of({{"rdzv_endpoint", "job-node-0-0.job:29500"}},
                            {{"PET_NNODES", "2"}, {"PET_NPROC_PER_NODE", "3"}, {"PET_NODE_RANK", "1"}});
  EXPECT_EQ(plan.nnodes, 2);
  EXPECT_EQ(plan.nproc_per_node, 3);
  EXPECT_EQ(plan.node_rank, 1);
  EXPECT_EQ(plan.world_size(), 6);
  EXPECT_EQ(plan.master_addr, "job-node-0-0.job");
  EXPECT_EQ(plan.master_port, 29500);
  EXPECT_TRUE(plan.launches_workers());
}

TEST(LaunchPlan, FlagsWinOverTheirPetVariables) {
  LaunchPlan plan = plan_of({{"nnodes", "1"}, {"nproc_per_node", "2"}, {"master_port", "29400"}},
                            {{"PET_NNODES", "4"}, {"PET_NPROC_PER_NODE", "8"}, {"PET_MASTER_PORT", "29501"},
                             {"PET_MASTER_ADDR", "job-node-0-0.job"}});
  EXPECT_EQ(plan.nnodes, 1);
  EXPECT_EQ(plan.nproc_per_node, 2);
  EXPECT_EQ(plan.master_port, 29400);
  EXPECT_EQ(plan.master_addr, "job-node-0-0.job");  // no flag: the variable
}

TEST(LaunchPlan, NnodesIsOneCountWrittenNOrNColonN) {
  EXPECT_EQ(plan_of({{"nnodes", "2"}}).nnodes, 2);
  EXPECT_EQ(plan_of({{"nnodes", "2:2"}}).nnodes, 2);
  EXPECT_EQ(plan_of({}, {{"PET_NNODES", "3:3"}}).nnodes, 3);
  for (const char* bad : {"0", "0:0", "2:1", "x", "1:", ":2", "1:2:3", "-1", " 2"})
    EXPECT_NE(errors_of({{"nnodes", bad}}).find("expected a node count N >= 1 (or N:N)"), std::string::npos) << bad;
}

TEST(LaunchPlan, AnElasticNnodesRangeIsRefusedNamingTheFlag) {
  std::string m = errors_of({{"nnodes", "1:4"}, {"nproc_per_node", "2"}});
  EXPECT_NE(m.find("--nnodes=1:4: `1:4` is an elastic range (MIN:MAX); elastic node ranges are not supported"),
            std::string::npos) << m;
  EXPECT_EQ(m.find("elasticPolicy"), std::string::npos) << m;  // the Kubeflow hint is for the variable only
}

TEST(LaunchPlan, AnElasticRangeInPetNnodesIsRefusedNamingTheVariable) {
  // What upstream Kubeflow Trainer injects for a runtime with mlPolicy.torch.elasticPolicy.
  std::string m = errors_of({}, {{"PET_NNODES", "2:3"}, {"PET_NODE_RANK", "1"}});
  EXPECT_NE(m.find("env PET_NNODES: `2:3` is an elastic range"), std::string::npos) << m;
  EXPECT_NE(m.find("elastic node ranges are not supported"), std::string::npos) << m;
  EXPECT_NE(m.find("mlPolicy.torch.elasticPolicy"), std::string::npos) << m;
  // The flag, when given, is what counts: a fixed --nnodes beats an elastic PET_NNODES.
  EXPECT_EQ(plan_of({{"nnodes", "2"}}, {{"PET_NNODES", "2:3"}}).nnodes, 2);
}

TEST(LaunchPlan, NprocPerNodeAutoCpuGpuAreResolvedOnThisNode) {
  int cpus = int(sysconf(_SC_NPROCESSORS_ONLN));
  int gpus = gpus_on_this_node();
  EXPECT_EQ(plan_of({{"nproc_per_node", "auto"}}).nproc_per_node, gpus > 0 ? gpus : cpus);
  EXPECT_EQ(plan_of({{"nproc_per_node", "cpu"}}).nproc_per_node, cpus);
  EXPECT_EQ(plan_of({}, {{"PET_NPROC_PER_NODE", "auto"}}).nproc_per_node, auto_nproc_per_node());
  if (gpus > 0)
    EXPECT_EQ(plan_of({{"nproc_per_node", "gpu"}}).nproc_per_node, gpus);
  else
    EXPECT_NE(errors_of({{"nproc_per_node", "gpu"}}).find("--nproc_per_node=gpu: is gpu, but this node has no NVIDIA GPU"),
              std::string::npos);
  EXPECT_NE(errors_of({{"nproc_per_node", "0"}}).find("expected a process count >= 1, auto, cpu or gpu"), std::string::npos);
  EXPECT_NE(errors_of({}, {{"PET_NPROC_PER_NODE", "two"}}).find("env PET_NPROC_PER_NODE: expected a process count"),
            std::string::npos);
}

// torchtune's `tune run` makes a run without --rdzv_endpoint standalone, "so that several jobs run
// side by side": one node's store takes a free port unless a port is given; several nodes keep 29500.
TEST(LaunchPlan, OneNodeWithoutAnEndpointTakesAFreePort) {
  EXPECT_EQ(plan_of({{"nproc_per_node", "2"}}).master_port, 0);
  EXPECT_EQ(plan_of({{"nproc_per_node", "2"}, {"master_port", "29400"}}).master_port, 29400);
  EXPECT_EQ(plan_of({{"nproc_per_node", "2"}}, {{"PET_MASTER_PORT", "29411"}}).master_port, 29411);
  EXPECT_EQ(plan_of({{"nproc_per_node", "2"}, {"rdzv_endpoint", "localhost:29422"}}).master_port, 29422);
  EXPECT_EQ(plan_of({{"nnodes", "2"}}).master_port, 29500);
}

TEST(LaunchPlan, NodeRankComesOnlyFromTheFlagOrPetNodeRank) {
  // GROUP_RANK, NODE_RANK, MASTER_ADDR, MASTER_PORT and NNODES are what a launcher sets for its
  // workers; a `ktune run` started with them in its env must not take them as its own options.
  LaunchPlan plan = plan_of({{"nnodes", "2"}}, {{"GROUP_RANK", "1"}, {"NODE_RANK", "1"}, {"MASTER_ADDR", "10.0.0.9"},
                                                {"MASTER_PORT", "1234"}, {"NNODES", "4"}, {"NPROC_PER_NODE", "4"}});
  EXPECT_EQ(plan.node_rank, 0);
  EXPECT_EQ(plan.master_addr, "127.0.0.1");
  EXPECT_EQ(plan.master_port, 29500);
  EXPECT_EQ(plan.nproc_per_node, 1);
  EXPECT_EQ(plan_of({{"nnodes", "2"}}, {{"PET_NODE_RANK", "1"}}).node_rank, 1);
}

TEST(LaunchPlan, NodeRankMustBeBelowNnodesWhereverEachCameFrom) {
  EXPECT_NE(errors_of({{"nnodes", "2"}, {"node_rank", "2"}}).find("--node_rank=2: node rank 2 is not below --nnodes 2"),
            std::string::npos);
  EXPECT_NE(errors_of({}, {{"PET_NNODES", "2"}, {"PET_NODE_RANK", "3"}})
                .find("env PET_NODE_RANK: node rank 3 is not below --nnodes 2 (env PET_NNODES)"),
            std::string::npos);
  EXPECT_NE(errors_of({{"node_rank", "1"}}).find("not below --nnodes 1"), std::string::npos);
  EXPECT_NE(errors_of({}, {{"PET_NODE_RANK", "-1"}}).find("env PET_NODE_RANK: expected a node rank >= 0"), std::string::npos);
  // A bad node count is reported once, not again as a rank out of range.
  std::string m = errors_of({{"nnodes", "1:4"}, {"node_rank", "2"}});
  EXPECT_EQ(m.find("not below"), std::string::npos) << m;
}

TEST(LaunchPlan, TheRdzvEndpointIsTheRendezvousAddressOverMasterAddrAndPort) {
  LaunchPlan plan = plan_of({{"rdzv_endpoint", "host-0:29600"}, {"master_addr", "10.0.0.1"}, {"master_port", "29400"}});
  EXPECT_EQ(plan.master_addr, "host-0");
  EXPECT_EQ(plan.master_port, 29600);
  EXPECT_EQ(plan_of({{"rdzv_endpoint", "host-0"}}).master_port, 29500);
  LaunchPlan masters = plan_of({{"master_addr", "10.0.0.1"}, {"master_port", "29400"}});
  EXPECT_EQ(masters.master_addr, "10.0.0.1");
  EXPECT_EQ(masters.master_port, 29400);
  EXPECT_FALSE(masters.launches_workers());
  for (const char* bad : {"host:notaport", "host:0", "host:70000", ":29500"})
    EXPECT_NE(errors_of({{"rdzv_endpoint", bad}}).find("expected HOST[:PORT] with a port in 1..65535"), std::string::npos) << bad;
  EXPECT_NE(errors_of({{"master_port", "70000"}}).find("--master_port=70000: expected a port in 1..65535"), std::string::npos);
  EXPECT_NE(errors_of({{"master_addr", ""}}).find("--master_addr=: expected a host name or address"), std::string::npos);
}

TEST(LaunchPlan, RdzvBackendIsStaticOrC10d) {
  EXPECT_EQ(plan_of({{"rdzv_backend", "c10d"}, {"rdzv_id", "job-7"}}).rdzv_backend, "c10d");
  EXPECT_EQ(plan_of({}, {{"PET_RDZV_ID", "job-7"}}).rdzv_id, "job-7");
  EXPECT_NE(errors_of({{"rdzv_backend", "etcd"}}).find("--rdzv_backend=etcd: ktune's rendezvous is a TCP store on node 0"),
            std::string::npos);
}

TEST(LaunchPlan, StandaloneIsOneNodeOnAFreeLocalPort) {
  LaunchPlan plan = plan_of({{"standalone", "1"}, {"nproc_per_node", "2"}, {"rdzv_endpoint", "elsewhere:1234"}});
  EXPECT_TRUE(plan.standalone);
  EXPECT_EQ(plan.master_addr, "127.0.0.1");
  EXPECT_EQ(plan.master_port, 0);  // run_launcher's store binds a free one
  EXPECT_TRUE(plan.launches_workers());
  EXPECT_TRUE(plan_of({}, {{"PET_STANDALONE", "1"}}).standalone);
  EXPECT_FALSE(plan_of({{"standalone", "0"}}).standalone);
  EXPECT_TRUE(plan_of({{"standalone", "1"}, {"nnodes", "1:1"}}).standalone);
  EXPECT_NE(errors_of({{"standalone", "1"}, {"nnodes", "2"}}).find("--standalone=1: means one node, but --nnodes=2 gives 2"),
            std::string::npos);
  EXPECT_NE(errors_of({{"standalone", "1"}}, {{"PET_NNODES", "3"}}).find("but env PET_NNODES gives 3"), std::string::npos);
}

TEST(LaunchPlan, AnEmptyVariableCountsAsUnset) {
  LaunchPlan plan = plan_of({}, {{"PET_NNODES", ""}, {"PET_NPROC_PER_NODE", ""}, {"PET_MASTER_ADDR", ""}});
  EXPECT_EQ(plan.nnodes, 1);
  EXPECT_EQ(plan.nproc_per_node, 1);
  EXPECT_EQ(plan.master_addr, "127.0.0.1");
}

TEST(LaunchPlan, WorkersAreLaunchedForMoreThanOneProcessOrARendezvous) {
  EXPECT_FALSE(plan_of({{"nnodes", "1"}, {"nproc_per_node", "1"}}).launches_workers());
  EXPECT_TRUE(plan_of({{"nproc_per_node", "2"}}).launches_workers());
  EXPECT_TRUE(plan_of({{"nnodes", "2"}}).launches_workers());
  EXPECT_TRUE(plan_of({{"nnodes", "2:2"}}).launches_workers());
  EXPECT_TRUE(plan_of({{"rdzv_endpoint", "localhost:29500"}}).launches_workers());
  EXPECT_TRUE(plan_of({{"standalone", "1"}}).launches_workers());
  EXPECT_EQ(plan_of({{"nproc_per_node", "auto"}}).launches_workers(), auto_nproc_per_node() > 1);
}

TEST(LaunchPlan, EveryProblemIsReportedTogether) {
  std::string m = errors_of({{"nnodes", "1:4"}, {"nproc_per_node", "x"}, {"master_port", "0"}, {"rdzv_backend", "etcd"}},
                            {{"KTUNE_RDZV_TIMEOUT", "soon"}});
  EXPECT_NE(m.find("5 errors"), std::string::npos) << m;
  EXPECT_NE(m.find("env KTUNE_RDZV_TIMEOUT: expected a number of seconds"), std::string::npos) << m;
  EXPECT_EQ(plan_of({}, {{"KTUNE_RDZV_TIMEOUT", "7"}}).rdzv_timeout, std::chrono::seconds(7));
}

TEST(LaunchPlan, OptionsAreFoundInEitherSpelling) {
  ASSERT_NE(find_launcher_option("nproc-per-node"), nullptr);
  EXPECT_STREQ(find_launcher_option("nproc-per-node")->name, "nproc_per_node");
  EXPECT_STREQ(find_launcher_option("node_rank")->env, "PET_NODE_RANK");
  EXPECT_TRUE(find_launcher_option("standalone")->is_switch);
  EXPECT_EQ(find_launcher_option("nprocs"), nullptr);
}
