// The local backend: dependency order, parallel initializers, the env and /workspace rewriting,
// exit codes, deleting, a killed supervisor, pid reuse, logs follow, secrets and progress. Every
// test runs real processes under a temporary KTUNE_HOME, supervised by the test supervisor binary.
#include <gtest/gtest.h>

#include <fstream>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <regex>
#include <set>

#include "core/error.h"
#include "sdk/process_identity.h"
#include "test_home.h"

namespace ktune::sdk {
namespace {

using testing::eventually;
using testing::local_config;
using testing::plan_of;
using testing::read_text;
using testing::shell_step;
using testing::TempHome;

TrainJobRecord wait_terminal(LocalBackend& backend, const std::string& name, double seconds = 30) {
  TrainJobRecord job;
  EXPECT_TRUE(eventually([&] {
    job = backend.get_job(name);
    return is_terminal(job.status);
  }, seconds)) << "job " << name << " still " << job.status;
  return job;
}

TEST(LocalBackend, GivesAnUnnamedJobAnUpstreamShapedName) {
  TempHome home;
  LocalBackend backend(local_config(home.path()));
  std::string name = backend.submit(plan_of({shell_step("node-0", "true", {}, 0)}));
  EXPECT_TRUE(std::regex_match(name, std::regex("^[a-z][0-9a-f]{11}$"))) << name;
  EXPECT_EQ(wait_terminal(backend, name).status, kComplete);
}

TEST(LocalBackend, ReRootsThePlansOwnWorkspacePath) {
  TempHome home;
  LocalBackend backend(local_config(home.path()));
  TrainJobPlan p = plan_of({shell_step("node-0", "echo ok > /mnt/shared/out.txt; echo $OUT > /mnt/shared/env.txt", {}, 0)});
  p.workspace = "/mnt/shared";
  p.steps[0].working_dir = "/mnt/shared";
  p.steps[0].env = {{"OUT", "/mnt/shared/output"}};
  std::string name = backend.submit(p);
  TrainJobRecord job = wait_terminal(backend, name);
  ASSERT_EQ(job.status, kComplete) << job.reason;
  EXPECT_EQ(read_text(job.workspace + "/out.txt"), "ok\n");
  EXPECT_EQ(read_text(job.workspace + "/env.txt"), job.workspace + "/output\n");
}

TEST(LocalBackend, RunsInitializersInParallelThenTheNodeAfterBoth) {
  TempHome home;
  LocalBackend backend(local_config(home.path()));
  std::string name = backend.submit(plan_of({
      shell_step("dataset-initializer", "sleep 0.6; echo data > /workspace/dataset.txt"),
      shell_step("model-initializer", "sleep 0.6; echo model > /workspace/model.txt"),
      shell_step("node-0", "cat /workspace/dataset.txt /workspace/model.txt > /workspace/seen.txt",
                 {"dataset-initializer", "model-initializer"}, 0),
  }));
  TrainJobRecord job = wait_terminal(backend, name);
  ASSERT_EQ(job.status, kComplete) << job.reason;
  const StepRecord& d = *job.step("dataset-initializer");
  const StepRecord& m = *job.step("model-initializer");
  const StepRecord& n = *job.step("node-0");
  // Parallel: each initializer started before the other finished.
  EXPECT_LT(d.started_at, m.finished_at);
  EXPECT_LT(m.started_at, d.finished_at);
  // Ordered: the node started after both finished, and saw both outputs.
  EXPECT_GE(n.started_at, d.finished_at);
  EXPECT_GE(n.started_at, m.finished_at);
  EXPECT_EQ(read_text(job.workspace + "/seen.txt"), "data\nmodel\n");
  for (const StepRecord& s : job.steps) {
    EXPECT_EQ(s.status, kComplete) << s.name;
    EXPECT_EQ(s.exit_code, 0) << s.name;
  }
  EXPECT_GT(job.finished_at, job.started_at);
  EXPECT_EQ(job.workspace, std::filesystem::path(home.path()) / "jobs" / name);
}

TEST(LocalBackend, NodeStepsGetTheTorchrunEnvAndWorkspacePaths) {
  TempHome home;
  LocalBackend backend(local_config(home.path()));
  PlanStep node = shell_step("node-0", "env > /workspace/env.txt; pwd > /workspace/pwd.txt; echo \"$@\" > /workspace/args.txt",
                             {}, 0);
  node.command.push_back("sh");  // $0
  node.command.push_back("--rdzv_endpoint=job-node-0-0.job:29500");
  node.command.push_back("output_dir=/workspace/output");
  node.env = {{"PET_NNODES", "1"}, {"PET_NPROC_PER_NODE", "1"}, {"PET_NODE_RANK", "0"}, {"DATA", "/workspace/dataset"}};
  PlanStep init = shell_step("dataset-initializer", "env > /workspace/init-env.txt");
  std::string name = backend.submit(plan_of({init, node}));
  TrainJobRecord job = wait_terminal(backend, name);
  ASSERT_EQ(job.status, kComplete) << job.reason;
  const std::string ws = job.workspace;
  std::string env = read_text(ws + "/env.txt");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(env, m, std::regex("\nMASTER_PORT=([0-9]+)\n"))) << env;
  const std::string port = m[1];
  EXPECT_GT(std::stoi(port), 0);
  EXPECT_NE(env.find("\nMASTER_ADDR=127.0.0.1\n"), std::string::npos);
  EXPECT_NE(env.find("\nPET_MASTER_ADDR=127.0.0.1\n"), std::string::npos);
  EXPECT_NE(env.find("\nPET_MASTER_PORT=" + port + "\n"), std::string::npos);
  EXPECT_NE(env.find("\nPET_NODE_RANK=0\n"), std::string::npos);
  EXPECT_NE(env.find("\nPET_NNODES=1\n"), std::string::npos);
  EXPECT_NE(env.find("\nDATA=" + ws + "/dataset\n"), std::string::npos);
  EXPECT_NE(env.find("\nKTUNE_PROGRESS_FILE=" + ws + "/progress/node-0.jsonl\n"), std::string::npos);
  EXPECT_EQ(read_text(ws + "/pwd.txt"), ws + "\n");
  EXPECT_EQ(read_text(ws + "/args.txt"), "--rdzv_endpoint=127.0.0.1:" + port + " output_dir=" + ws + "/output\n");
  // Initializers get no torchrun env and no progress file.
  std::string init_env = read_text(ws + "/init-env.txt");
  EXPECT_EQ(init_env.find("MASTER_PORT="), std::string::npos);
  EXPECT_EQ(init_env.find("KTUNE_PROGRESS_FILE="), std::string::npos);
  // The registry shows the command and env exactly as run.
  const StepRecord& n = *job.step("node-0");
  EXPECT_EQ(n.env.at("MASTER_PORT"), port);
  EXPECT_EQ(n.command.at(4), "--rdzv_endpoint=127.0.0.1:" + port);
}

TEST(LocalBackend, AFailedStepFailsTheJobStopsItsSiblingAndSkipsDependents) {
  TempHome home;
  LocalBackend backend(local_config(home.path()));
  auto t0 = std::chrono::steady_clock::now();
  std::string name = backend.submit(plan_of({
      shell_step("dataset-initializer", "echo broken >&2; exit 3"),
      shell_step("model-initializer", "sleep 30"),
      shell_step("node-0", "touch /workspace/node-ran", {"dataset-initializer", "model-initializer"}, 0),
  }));
  TrainJobRecord job = wait_terminal(backend, name);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(seconds, 15);
  ASSERT_EQ(job.status, kFailed);
  EXPECT_NE(job.reason.find("dataset-initializer exited with code 3"), std::string::npos) << job.reason;
  EXPECT_EQ(job.step("dataset-initializer")->status, kFailed);
  EXPECT_EQ(job.step("dataset-initializer")->exit_code, 3);
  EXPECT_EQ(job.step("model-initializer")->status, kFailed);
  EXPECT_EQ(job.step("model-initializer")->exit_code, 128 + SIGTERM);
  EXPECT_EQ(job.step("node-0")->status, kCreated);
  EXPECT_FALSE(std::filesystem::exists(job.workspace + "/node-ran"));
  EXPECT_FALSE(process_is_alive(job.step("model-initializer")->pid, job.step("model-initializer")->pid_start_time));
  EXPECT_NE(read_text(job.step("dataset-initializer")->log_path).find("broken"), std::string::npos);
}

// A step killed by a SIGKILL that nobody in the job sent (the out-of-memory killer's way, or another
// process's kill -9) fails the job naming the kill and the step's peak resident memory.
TEST(LocalBackend, AStepKilledFromOutsideFailsTheJobNamingTheKillAndItsPeakMemory) {
  TempHome home;
  LocalBackend backend(local_config(home.path()));
  std::string name = backend.submit(plan_of({shell_step("node-0", "kill -9 $$", {}, 0)}));
  TrainJobRecord job = wait_terminal(backend, name);
  ASSERT_EQ(job.status, kFailed);
  EXPECT_EQ(job.step("node-0")->exit_code, 128 + SIGKILL);
  // A shell's few MiB are far below any machine's limit: named as another process's kill -9 more
  // likely than the out-of-memory killer (process_exit.h), with the peak.
  EXPECT_NE(job.reason.find("step node-0 was killed by signal Killed (not by its parent, and hardly by the "
                            "out-of-memory killer: its peak resident memory was "),
            std::string::npos)
      << job.reason;
}

TEST(LocalBackend, ACommandThatCannotRunFailsWithCode127) {
  TempHome home;
  LocalBackend backend(local_config(home.path()));
  PlanStep s;
  s.name = "node-0";
  s.node_rank = 0;
  s.command = {"/nonexistent/ktune-trainer", "run"};
  std::string name = backend.submit(plan_of({s}));
  TrainJobRecord job = wait_terminal(backend, name);
  EXPECT_EQ(job.status, kFailed);
  EXPECT_EQ(job.step("node-0")->exit_code, 127);
  EXPECT_NE(read_text(job.step("node-0")->log_path).find("cannot run '/nonexistent/ktune-trainer'"), std::string::npos);
}

TEST(LocalBackend, DeleteStopsEveryProcessOfTheJobAndForgetsIt) {
  TempHome home;
  LocalBackend backend(local_config(home.path()));
  // The step starts a background child too: deleting must stop the whole process group.
  std::string name = backend.submit(plan_of({shell_step(
      "node-0", "sleep 60 & echo $! > /workspace/child.pid; echo $$ > /workspace/step.pid; wait", {}, 0)}));
  TrainJobRecord job = backend.get_job(name);
  const std::string ws = job.workspace;
  ASSERT_TRUE(eventually([&] { return !read_text(ws + "/child.pid").empty() && !read_text(ws + "/step.pid").empty(); }));
  int step_pid = std::stoi(read_text(ws + "/step.pid"));
  int child_pid = std::stoi(read_text(ws + "/child.pid"));
  // The supervisor records the step's pid after its fork, which the step's shell may outrun.
  ASSERT_TRUE(eventually([&] { return backend.get_job(name).step("node-0")->pid == step_pid; }));
  job = backend.get_job(name);
  ASSERT_TRUE(process_is_alive(step_pid, 0));
  ASSERT_TRUE(process_is_alive(child_pid, 0));
  const int supervisor = job.supervisor_pid;
  backend.delete_job(name);
  EXPECT_TRUE(eventually([&] { return !process_is_alive(step_pid, 0) && !process_is_alive(child_pid, 0); }, 5));
  EXPECT_FALSE(process_is_alive(supervisor, job.supervisor_start_time));
  EXPECT_THROW(backend.get_job(name), Error);
  EXPECT_TRUE(backend.list_jobs().empty());
  EXPECT_TRUE(std::filesystem::exists(ws));  // kept unless asked
  EXPECT_THROW(backend.delete_job(name), Error);
}

TEST(LocalBackend, DeleteWithWorkspaceRemovesTheFiles) {
  TempHome home;
  LocalBackend backend(local_config(home.path()));
  std::string name = backend.submit(plan_of({shell_step("node-0", "echo hi > /workspace/out.txt", {}, 0)}));
  TrainJobRecord job = wait_terminal(backend, name);
  ASSERT_TRUE(std::filesystem::exists(job.workspace + "/out.txt"));
  backend.delete_job(name, /*remove_workspace=*/true);
  EXPECT_FALSE(std::filesystem::exists(job.workspace));
}

TEST(LocalBackend, AKilledSupervisorIsDetectedAndTheJobMarkedFailed) {
  TempHome home;
  LocalBackend backend(local_config(home.path()));
  std::string name = backend.submit(plan_of({shell_step("node-0", "echo $$ > /workspace/step.pid; exec sleep 60", {}, 0)}));
  TrainJobRecord job = backend.get_job(name);
  ASSERT_TRUE(eventually([&] { return !read_text(job.workspace + "/step.pid").empty(); }));
  // The supervisor records the step as running after its fork, which the step's shell may outrun.
  ASSERT_TRUE(eventually([&] {
    job = backend.get_job(name);
    return job.status == kRunning && job.step("node-0")->status == kRunning && job.step("node-0")->pid > 0;
  }));
  const int step_pid = job.step("node-0")->pid;
  ASSERT_EQ(kill(job.supervisor_pid, SIGKILL), 0);
  ASSERT_TRUE(eventually([&] { return !process_is_alive(job.supervisor_pid, job.supervisor_start_time); }, 5));
  // A fresh reader (another shell) sees the truth.
  LocalBackend reader(local_config(home.path()));
  TrainJobRecord seen = reader.get_job(name);
  EXPECT_EQ(seen.status, kFailed);
  EXPECT_NE(seen.reason.find("supervisor (pid " + std::to_string(job.supervisor_pid) + ")"), std::string::npos)
      << seen.reason;
  EXPECT_EQ(seen.step("node-0")->status, kFailed);
  EXPECT_GT(seen.finished_at, 0);
  EXPECT_TRUE(eventually([&] { return !process_is_alive(step_pid, 0); }, 5));
  // And the verdict is stored, not recomputed: the raw registry says Failed too.
  JobRegistry registry(home.path() + "/registry.db");
  EXPECT_EQ(registry.find(name)->status, kFailed);
}

TEST(LocalBackend, AReusedSupervisorPidIsNotMistakenForTheSupervisor) {
  TempHome home;
  LocalBackend backend(local_config(home.path()));
  JobRegistry registry(home.path() + "/registry.db");
  TrainJobRecord job;
  job.name = "a00000000001";
  job.runtime = "test-runtime";
  job.status = kRunning;
  job.created_at = unix_now();
  job.workspace = home.path() + "/jobs/a00000000001";
  // This test process is alive, but it is not the process that started at tick 1.
  job.supervisor_pid = int(getpid());
  job.supervisor_start_time = 1;
  registry.insert(job);
  TrainJobRecord seen = backend.get_job(job.name);
  EXPECT_EQ(seen.status, kFailed);
  EXPECT_NE(seen.reason.find("killed or crashed"), std::string::npos);
}

TEST(LocalBackend, FollowingLogsReturnsEveryLineUntilTheStepEnds) {
  TempHome home;
  LocalBackend backend(local_config(home.path()));
  std::string name = backend.submit(plan_of({shell_step(
      "node-0", "i=1; while [ $i -le 15 ]; do echo line $i; sleep 0.05; i=$((i+1)); done; printf 'bar 1\\rbar 2\\rdone'",
      {}, 0)}));
  std::vector<std::string> lines;
  backend.get_job_logs(name, "node-0", /*follow=*/true, [&](const std::string& l) {
    lines.push_back(l);
    return true;
  });
  ASSERT_EQ(lines.size(), 18u);
  for (int i = 0; i < 15; ++i) EXPECT_EQ(lines[size_t(i)], "line " + std::to_string(i + 1));
  EXPECT_EQ(lines[15], "bar 1");
  EXPECT_EQ(lines[17], "done");
  // Following returned only once the step had ended; a later read gives the same lines.
  EXPECT_TRUE(is_terminal(backend.get_job(name).step("node-0")->status));
  std::vector<std::string> again;
  backend.get_job_logs(name, "node-0", false, [&](const std::string& l) {
    again.push_back(l);
    return true;
  });
  EXPECT_EQ(again, lines);
  // A sink can stop early.
  int n = 0;
  backend.get_job_logs(name, "node-0", true, [&](const std::string&) { return ++n < 3; });
  EXPECT_EQ(n, 3);
  EXPECT_THROW(backend.get_job_logs(name, "node-7", false, [](const std::string&) { return true; }), Error);
}

TEST(LocalBackend, FollowingAStepThatNeverStartsEndsWithItsJob) {
  TempHome home;
  LocalBackend backend(local_config(home.path()));
  std::string name = backend.submit(plan_of({
      shell_step("model-initializer", "sleep 0.3; exit 1"),
      shell_step("node-0", "echo never", {"model-initializer"}, 0),
  }));
  std::vector<std::string> lines;
  backend.get_job_logs(name, "node-0", true, [&](const std::string& l) {
    lines.push_back(l);
    return true;
  });
  EXPECT_TRUE(lines.empty());
  EXPECT_EQ(backend.get_job(name).status, kFailed);
}

TEST(LocalBackend, SecretsReachTheProcessButNeverTheRegistryOrTheLogs) {
  TempHome home;
  const std::string secret = "hfsecret-8d7f6e5c4b3a2910";
  LocalBackend backend(local_config(home.path()));
  PlanStep init = shell_step("model-initializer",
                             "[ \"$ACCESS_TOKEN\" = '" + std::string("hfsecret-") +
                                 "'\"8d7f6e5c4b3a2910\" ] && touch /workspace/token-ok; echo \"token is $ACCESS_TOKEN\"");
  init.secret_env = {{"ACCESS_TOKEN", secret}};
  init.env = {{"STORAGE_URI", "hf://org/model"}};
  std::string name = backend.submit(plan_of({init, shell_step("node-0", "true", {"model-initializer"}, 0)}));
  TrainJobRecord job = wait_terminal(backend, name);
  ASSERT_EQ(job.status, kComplete) << job.reason;
  EXPECT_TRUE(std::filesystem::exists(job.workspace + "/token-ok"));  // the process got it
  const StepRecord& s = *job.step("model-initializer");
  EXPECT_EQ(s.env.count("ACCESS_TOKEN"), 0u);
  EXPECT_EQ(s.secret_env_keys, std::vector<std::string>{"ACCESS_TOKEN"});
  EXPECT_NE(read_text(s.log_path).find("token is ***"), std::string::npos) << read_text(s.log_path);
  // No file under KTUNE_HOME (registry, WAL, logs, workspace) holds the secret.
  for (const auto& entry : std::filesystem::recursive_directory_iterator(home.path())) {
    if (!entry.is_regular_file()) continue;
    EXPECT_EQ(read_text(entry.path().string()).find(secret), std::string::npos) << entry.path();
  }
}

TEST(LocalBackend, TrainerProgressReachesTheJobStatus) {
  TempHome home;
  LocalBackend backend(local_config(home.path()));
  const std::string script =
      "for i in 1 2 3; do echo '{\"step\":'$i',\"total_steps\":12,\"epoch\":0,\"loss\":2.5,\"lr\":0.0003,"
      "\"tokens_per_second\":800}' >> \"$KTUNE_PROGRESS_FILE\"; done; "
      "printf '{\"step\":4,\"total' >> \"$KTUNE_PROGRESS_FILE\"; touch /workspace/written; sleep 30";
  std::string name = backend.submit(plan_of({shell_step("node-0", script, {}, 0)}));
  // Read the progress only after the script has written all of it (the three lines and the
  // half-written fourth): read earlier, it may hold the first line alone.
  TrainJobRecord job = backend.get_job(name);
  ASSERT_TRUE(eventually([&] { return std::filesystem::exists(job.workspace + "/written"); }));
  job = backend.get_job(name);
  ASSERT_TRUE(job.progress.present);
  EXPECT_EQ(job.progress.step, 3);  // the half-written 4th line is not read
  EXPECT_EQ(job.progress.total_steps, 12);
  EXPECT_DOUBLE_EQ(job.progress.progress_percentage, 25.0);
  EXPECT_DOUBLE_EQ(job.progress.metrics.at("loss"), 2.5);
  EXPECT_DOUBLE_EQ(job.progress.metrics.at("tokens_per_second"), 800);
  EXPECT_GE(job.progress.estimated_remaining_seconds, 0);
  // The supervisor copies it into the registry (for readers after the workspace is gone).
  JobRegistry registry(home.path() + "/registry.db");
  EXPECT_TRUE(eventually([&] { return registry.find(name)->progress.step == 3; }, 5));
  backend.delete_job(name);
}

TEST(LocalBackend, AJobOutlivesTheProcessThatSubmittedIt) {
  TempHome home;
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  pid_t child = fork();
  if (child == 0) {
    close(fds[0]);
    LocalBackend backend(local_config(home.path()));
    // The step runs until the test lets it finish (a go file), however slowly anything here starts.
    std::string name = backend.submit(plan_of({shell_step(
        "node-0", "while [ ! -e /workspace/go ]; do sleep 0.05; done; echo done > /workspace/out.txt", {}, 0)}));
    (void)!write(fds[1], name.data(), name.size());
    _exit(0);
  }
  close(fds[1]);
  char buf[64] = {};
  ssize_t n = read(fds[0], buf, sizeof(buf) - 1);
  close(fds[0]);
  int st = 0;
  waitpid(child, &st, 0);
  ASSERT_GT(n, 0);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  const std::string name(buf, size_t(n));
  LocalBackend later(local_config(home.path()));
  EXPECT_TRUE(eventually([&] { return later.get_job(name).status == kRunning; }));  // its submitter is gone, the job is not
  std::ofstream(later.get_job(name).workspace + "/go") << "";
  TrainJobRecord job = wait_terminal(later, name);
  EXPECT_EQ(job.status, kComplete) << job.reason;
  EXPECT_EQ(read_text(job.workspace + "/out.txt"), "done\n");
}

TEST(LocalBackend, RefusesBadPlansBeforeWritingAnything) {
  TempHome home;
  LocalBackend backend(local_config(home.path()));
  EXPECT_THROW(backend.submit(plan_of({})), Error);
  EXPECT_THROW(backend.submit(plan_of({shell_step("node-0", "true", {"model-initializer"}, 0)})), Error);
  EXPECT_THROW(backend.submit(plan_of({shell_step("a", "true", {"b"}), shell_step("b", "true", {"a"})})), Error);
  EXPECT_THROW(backend.submit(plan_of({shell_step("a", "true"), shell_step("a", "true")})), Error);
  EXPECT_THROW(backend.submit(plan_of({shell_step("../x", "true")})), Error);
  EXPECT_TRUE(backend.list_jobs().empty());
  // A name that is taken.
  TrainJobPlan p = plan_of({shell_step("node-0", "true", {}, 0)});
  p.job_name = "b123456789ab";
  EXPECT_EQ(backend.submit(p), "b123456789ab");
  try {
    backend.submit(p);
    FAIL() << "a second job of the same name was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("already exists (ktune jobs delete b123456789ab --workspace frees the name)"),
              std::string::npos)
        << e.what();
  }
  wait_terminal(backend, "b123456789ab");
  // Deleted with its files kept, the name is still taken by them, and the refusal says how to free it.
  backend.delete_job("b123456789ab");
  try {
    backend.submit(p);
    FAIL() << "a job was started over a deleted job's files";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the job's workspace already exists and is not empty (left by a deleted job "
                                         "b123456789ab? remove it, or delete jobs with --workspace"),
              std::string::npos)
        << e.what();
  }
}

TEST(LocalBackend, ListsJobsOldestFirstAndFiltersByRuntime) {
  TempHome home;
  LocalBackend backend(local_config(home.path()));
  std::string a = backend.submit(plan_of({shell_step("node-0", "true", {}, 0)}, "rt-a"));
  std::string b = backend.submit(plan_of({shell_step("node-0", "true", {}, 0)}, "rt-b"));
  std::string c = backend.submit(plan_of({shell_step("node-0", "true", {}, 0)}, "rt-a"));
  std::vector<TrainJobRecord> all = backend.list_jobs();
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].name, a);
  EXPECT_EQ(all[1].name, b);
  EXPECT_EQ(all[2].name, c);
  std::vector<TrainJobRecord> only_a = backend.list_jobs("rt-a");
  ASSERT_EQ(only_a.size(), 2u);
  EXPECT_EQ(only_a[0].name, a);
  EXPECT_EQ(only_a[1].name, c);
  for (const std::string& n : {a, b, c}) EXPECT_EQ(wait_terminal(backend, n).status, kComplete);
}

}  // namespace
}  // namespace ktune::sdk
