// The SQLite job registry: round trips, first-writer-wins transitions, and many processes writing
// and reading at once without a single SQLITE_BUSY reaching the caller.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "core/error.h"
#include "sdk/job_registry.h"
#include "test_home.h"

namespace ktune::sdk {
namespace {

using testing::TempHome;

TrainJobRecord sample_job(const std::string& name, const std::string& runtime = "torchtune-llama3.2-1b") {
  TrainJobRecord j;
  j.name = name;
  j.runtime = runtime;
  j.trainer_type = "BuiltinTrainer";
  j.num_nodes = 2;
  j.num_proc_per_node = 4;
  j.recipe = "full_finetune_distributed";
  j.config = "llama3_2/1B_full_multinode";
  j.created_at = 1700000000.25;
  j.workspace = "/tmp/ws/" + name;
  for (int r = 0; r < 2; ++r) {
    StepRecord s;
    s.name = "node-" + std::to_string(r);
    s.index = r;
    s.command = {"tune", "run", "--config", "x y"};
    s.env = {{"PET_NODE_RANK", std::to_string(r)}, {"A", "b=c"}};
    s.secret_env_keys = {"ACCESS_TOKEN"};
    s.working_dir = j.workspace;
    s.depends_on = {"model-initializer"};
    s.node_rank = r;
    s.num_proc = 4;
    s.device_count = "4";
    s.log_path = j.workspace + "/logs/" + s.name + ".log";
    s.progress_path = j.workspace + "/progress/" + s.name + ".jsonl";
    j.steps.push_back(s);
  }
  return j;
}

TEST(JobRegistry, StoresAndReadsBackAJobWithItsSteps) {
  TempHome home;
  JobRegistry reg(home.path() + "/registry.db");
  TrainJobRecord in = sample_job("a0123456789a");
  reg.insert(in);
  auto out = reg.find("a0123456789a");
  ASSERT_TRUE(out);
  EXPECT_EQ(out->runtime, in.runtime);
  EXPECT_EQ(out->num_nodes, 2);
  EXPECT_EQ(out->num_proc_per_node, 4);
  EXPECT_EQ(out->config, in.config);
  EXPECT_EQ(out->status, kCreated);
  EXPECT_DOUBLE_EQ(out->created_at, in.created_at);
  ASSERT_EQ(out->steps.size(), 2u);
  EXPECT_EQ(out->steps[1].name, "node-1");
  EXPECT_EQ(out->steps[1].command, in.steps[1].command);
  EXPECT_EQ(out->steps[1].env, in.steps[1].env);
  EXPECT_EQ(out->steps[1].secret_env_keys, in.steps[1].secret_env_keys);
  EXPECT_EQ(out->steps[1].depends_on, in.steps[1].depends_on);
  EXPECT_EQ(out->steps[1].node_rank, 1);
  EXPECT_EQ(out->steps[1].progress_path, in.steps[1].progress_path);
  EXPECT_FALSE(reg.find("nope"));
  EXPECT_THROW(reg.insert(in), Error);
  EXPECT_TRUE(reg.remove("a0123456789a"));
  EXPECT_FALSE(reg.find("a0123456789a"));
  EXPECT_FALSE(reg.remove("a0123456789a"));
}

TEST(JobRegistry, TheFirstTerminalStatusWins) {
  TempHome home;
  JobRegistry reg(home.path() + "/registry.db");
  reg.insert(sample_job("b0123456789a"));
  EXPECT_TRUE(reg.set_supervisor("b0123456789a", 4242, 99));
  EXPECT_TRUE(reg.mark_job_running("b0123456789a", 10));
  EXPECT_FALSE(reg.mark_job_running("b0123456789a", 11));  // only from Created
  EXPECT_TRUE(reg.mark_step_running("b0123456789a", "node-0", 555, 7, 12, {"x"}, {{"K", "V"}}));
  // A reader that believes an older supervisor died must not overwrite the live one's job.
  EXPECT_FALSE(reg.fail_job_if_supervisor("b0123456789a", 1111, "stale", 13));
  EXPECT_TRUE(reg.finish_job("b0123456789a", kComplete, "", 14));
  EXPECT_FALSE(reg.finish_job("b0123456789a", kFailed, "late", 15));
  EXPECT_FALSE(reg.fail_job_if_supervisor("b0123456789a", 4242, "dead", 16));
  auto j = reg.find("b0123456789a");
  EXPECT_EQ(j->status, kComplete);
  EXPECT_EQ(j->reason, "");
  EXPECT_DOUBLE_EQ(j->finished_at, 14);
  EXPECT_EQ(j->steps[0].status, kRunning);
  EXPECT_EQ(j->steps[0].pid, 555);
  EXPECT_EQ(j->steps[0].command, std::vector<std::string>{"x"});
  EXPECT_EQ(reg.fail_running_steps("b0123456789a", 17), 1);
  EXPECT_EQ(reg.find("b0123456789a")->steps[0].status, kFailed);
  EXPECT_EQ(reg.find("b0123456789a")->steps[1].status, kCreated);
  EXPECT_THROW(reg.finish_job("b0123456789a", kRunning, "", 1), Error);
}

TEST(JobRegistry, RecordsExportsOfAJobAndForgetsThemWithIt) {
  TempHome home;
  JobRegistry r(home.path() + "/registry.db");
  r.insert(sample_job("exported"));
  EXPECT_THROW(r.begin_export("nope", "file:///x", "all", 1.0), Error);
  const int first = r.begin_export("exported", "file:///tmp/out", "adapter", 10.0);
  const int second = r.begin_export("exported", "s3://bucket/model", "all", 20.0);
  EXPECT_NE(first, second);
  EXPECT_TRUE(r.finish_export(first, kComplete, R"({"file_count":2,"bytes":10})", "", 11.0));
  EXPECT_TRUE(r.finish_export(second, kFailed, "", "403 Forbidden", 21.0));
  EXPECT_FALSE(r.finish_export(second, kComplete, "", "", 22.0));  // already finished
  const TrainJobRecord j = *r.find("exported");
  ASSERT_EQ(j.exports.size(), 2u);
  EXPECT_EQ(j.exports[0].status, kComplete);
  EXPECT_EQ(j.exports[0].destination, "file:///tmp/out");
  EXPECT_EQ(j.exports[0].parts, "adapter");
  EXPECT_EQ(j.exports[0].summary_json, R"({"file_count":2,"bytes":10})");
  EXPECT_EQ(j.exports[0].started_at, 10.0);
  EXPECT_EQ(j.exports[0].finished_at, 11.0);
  EXPECT_EQ(j.exports[1].status, kFailed);
  EXPECT_EQ(j.exports[1].error, "403 Forbidden");
  EXPECT_TRUE(r.remove("exported"));
  r.insert(sample_job("exported"));
  EXPECT_TRUE(r.find("exported")->exports.empty());
}

TEST(JobRegistry, ManyProcessesWriteAndReadAtOnce) {
  TempHome home;
  const std::string db = home.path() + "/registry.db";
  { JobRegistry init(db); }
  const int writers = 4, jobs_each = 25;
  std::vector<pid_t> children;
  for (int w = 0; w < writers; ++w) {
    pid_t pid = fork();
    if (pid == 0) {
      int rc = 0;
      try {
        JobRegistry reg(db);
        for (int i = 0; i < jobs_each; ++i) {
          char name[32];
          std::snprintf(name, sizeof(name), "w%d%010d", w, i);
          reg.insert(sample_job(name, "rt-" + std::to_string(w)));
          reg.set_supervisor(name, 100 + i, 1);
          reg.mark_job_running(name, 1);
          reg.mark_step_running(name, "node-0", 200 + i, 2, 3, {"cmd"}, {});
          JobProgress p;
          p.present = true;
          p.step = i;
          reg.set_progress(name, p);
          reg.finish_step(name, "node-0", kComplete, 0, 4);
          reg.finish_job(name, i % 2 ? kComplete : kFailed, i % 2 ? "" : "odd", 5);
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr, "writer %d: %s\n", w, e.what());
        rc = 1;
      }
      _exit(rc);
    }
    children.push_back(pid);
  }
  // Meanwhile this process reads: every snapshot must be whole (a job never without its steps).
  int reads = 0;
  bool children_done = false;
  JobRegistry reader(db);
  while (!children_done) {
    for (const TrainJobRecord& j : reader.list()) {
      ASSERT_EQ(j.steps.size(), 2u) << j.name;
      if (j.status == kComplete) {
        ASSERT_EQ(j.steps[0].status, kComplete) << j.name;
      }
    }
    ++reads;
    children_done = true;
    for (pid_t c : children) {
      int st = 0;
      pid_t r = waitpid(c, &st, WNOHANG);
      if (r == 0) {
        children_done = false;
      } else if (r == c) {
        EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "a writer failed";
      }
    }
  }
  EXPECT_GT(reads, 1);
  std::vector<TrainJobRecord> all = reader.list();
  ASSERT_EQ(all.size(), size_t(writers * jobs_each));
  int complete = 0;
  for (const TrainJobRecord& j : all) {
    EXPECT_TRUE(is_terminal(j.status));
    EXPECT_TRUE(j.progress.present);
    complete += j.status == kComplete;
  }
  EXPECT_EQ(complete, writers * (jobs_each / 2));
  EXPECT_EQ(reader.list("rt-2").size(), size_t(jobs_each));
}

// The first use of a new home by several clients at once (notebooks started together): each opens
// the registry that none has made yet, then writes and reads at once. Switching a fresh database to
// WAL and creating its tables raced: one in ~100 of these processes failed "database is locked".
TEST(JobRegistry, ManyProcessesOpenANewRegistryAtOnce) {
  const int rounds = 20, processes = 4, threads_each = 3;
  for (int round = 0; round < rounds; ++round) {
    TempHome home;
    const std::string db = home.path() + "/registry.db";
    std::vector<pid_t> children;
    for (int p = 0; p < processes; ++p) {
      pid_t pid = fork();
      if (pid == 0) {
        std::atomic<int> rc = 0;
        std::vector<std::thread> threads;  // each its own connection, as each TrainerClient has
        for (int t = 0; t < threads_each; ++t)
          threads.emplace_back([&, t] {
            try {
              JobRegistry reg(db);
              char name[32];
              std::snprintf(name, sizeof(name), "p%dt%d", p, t);
              reg.insert(sample_job(name));
              if (reg.list().empty()) rc = 2;
            } catch (const std::exception& e) {
              std::fprintf(stderr, "round %d, process %d, thread %d: %s\n", round, p, t, e.what());
              rc = 1;
            }
          });
        for (std::thread& t : threads) t.join();
        _exit(rc);
      }
      children.push_back(pid);
    }
    for (pid_t c : children) {
      int st = 0;
      ASSERT_EQ(waitpid(c, &st, 0), c);
      EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "round " << round << ": a process failed";
    }
    EXPECT_EQ(JobRegistry(db).list().size(), size_t(processes * threads_each)) << "round " << round;
  }
}

}  // namespace
}  // namespace ktune::sdk
