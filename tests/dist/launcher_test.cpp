#include "dist/launcher.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <vector>
#include <future>
#include <regex>
#include <string>

#include "core/error.h"
#include "core/process_exit.h"
#include "dist/tcp_store.h"

using namespace ktune;
using namespace ktune::dist;

struct Result {
  int exit_code;
  std::string output;  // stdout and stderr together
};

// env: assignments for the launch (its workers inherit them); the collectives' timeout is 20 s unless
// it says otherwise, so that a test that fails does not hang for the default 30 minutes.
static Result run(const std::string& args, const std::string& env = "KTUNE_COLLECTIVE_TIMEOUT=20") {
  std::string command = env + " " + std::string(KTUNE_LAUNCH_TEST_WORKER) + " " + args + " 2>&1";
  Result r{-1, ""};
  std::FILE* p = popen(command.c_str(), "r");
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, p)) > 0) r.output.append(buffer, n);
  int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// A port free now, for the tests that must name one (an explicit endpoint, two nodes): another
// process may still take it before the launcher binds it, so single-node tests run standalone
// (the launcher binds a free port itself) instead.
static int free_port() {
  TcpStoreServer probe(0);
  return probe.port();
}

TEST(Launcher, RunsTheNodesWorkersWithTorchrunEnvAndRankPrefixes) {
  std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  Result r = run("1 2 0 " + endpoint + " ok");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[rank0]: rank 0 of 2 sum 3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[rank1]: rank 1 of 2 sum 3"), std::string::npos) << r.output;
}

TEST(Launcher, StandaloneTakesAFreePortAndTellsTheWorkers) {
  // The plan says port 0; node 0's store binds a free one and the workers must meet there.
  Result r = run("1 2 0 standalone ok");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[rank0]: rank 0 of 2 sum 3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[rank1]: rank 1 of 2 sum 3"), std::string::npos) << r.output;
}

TEST(Launcher, AFailingWorkerStopsTheOthersAndNamesTheRank) {
  Result r = run("1 3 0 standalone fail1");
  EXPECT_NE(r.exit_code, 0) << r.output;
  // The cause comes first, however the peers' exits were ordered; its own words come with it.
  // Rank 1 either finished its exit (code 3) or, still tearing down when a peer's failure made the
  // launcher stop everyone, met the SIGTERM on its way out: both are timing, not behaviour.
  static const std::regex cause(R"(job failed: rank 1 \(node0, pid \d+\) (exited with code 3|was killed by signal Terminated): )"
                                R"(rank 1 failing on purpose)");
  EXPECT_TRUE(std::regex_search(r.output, cause)) << r.output;
}

// A worker killed by a SIGKILL the launcher did not send is named with its peak resident memory (at
// least the 96 MiB it touched) against what the machine allows, and with what that most likely
// means: far below the limit (as here, unless the machine allows under 0.4 GiB), another process's
// kill -9 rather than the out-of-memory killer.
TEST(Launcher, AWorkerKilledFromOutsideIsNamedWithItsPeakMemory) {
  Result r = run("1 2 0 standalone killed1");
  EXPECT_NE(r.exit_code, 0) << r.output;
  static const std::regex cause(
      R"(job failed: rank 1 \(node0, pid \d+\) was killed by signal Killed \(not by its parent(.*): its peak resident )"
      R"(memory was ([0-9.]+) GiB, of ([0-9.]+) GiB this machine allows([^)]*)\))");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m, cause)) << r.output;
  EXPECT_GE(std::stod(m[2]), 0.09) << r.output;
  if (std::stod(m[2]) < kOomSuspectFraction * std::stod(m[3]))
    EXPECT_EQ(m[1].str() + "|" + m[4].str(), ", and hardly by the out-of-memory killer|; another process's kill -9?")
        << r.output;
  else
    EXPECT_EQ(m[1].str(), ": the kernel's out-of-memory killer sends SIGKILL when memory runs out;") << r.output;
}

TEST(Launcher, TheCauseIsNamedFirstEvenWhenItsPeersRecordTheirLostPeerBeforeIt) {
  Result r = run("1 3 0 standalone fail1_records_late");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("job failed: rank 1 (node0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("after its peers recorded theirs; after it: rank "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("a peer failed or the network broke"), std::string::npos) << r.output;
}

TEST(Launcher, TheCauseIsNamedFirstEvenWhenItsPeersExitBeforeIt) {
  Result r = run("1 3 0 standalone fail1_slow_exit");
  EXPECT_NE(r.exit_code, 0) << r.output;
  // Rank 1 is still lingering when ranks 0 and 2 fail (it holds off the launcher's SIGTERM); its
  // error file keeps its first record, which says it failed first, not its later one.
  EXPECT_NE(r.output.find("job failed: rank 1 (node0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 1 failing on purpose; after it: rank "), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("on its way out"), std::string::npos) << r.output;
}

// A launch in its own process group (as a terminal's foreground job), in mode joined_then_wait,
// that a test can signal: the launcher, the group, or a worker by the pid it printed once joined.
class LiveLaunch {
 public:
  LiveLaunch() {
    int out[2];
    if (pipe(out) != 0) throw std::runtime_error("pipe");
    pid_ = fork();
    if (pid_ == 0) {
      setpgid(0, 0);
      dup2(out[1], STDOUT_FILENO);
      dup2(out[1], STDERR_FILENO);
      close(out[0]);
      close(out[1]);
      setenv("KTUNE_COLLECTIVE_TIMEOUT", "20", 1);
      execl(KTUNE_LAUNCH_TEST_WORKER, KTUNE_LAUNCH_TEST_WORKER, "1", "2", "0", "standalone", "joined_then_wait",
            static_cast<char*>(nullptr));
      _exit(127);
    }
    close(out[1]);
    fd_ = out[0];
  }
  ~LiveLaunch() {
    if (fd_ >= 0) close(fd_);
    if (pid_ > 0 && !reaped_) {
      kill(-pid_, SIGKILL);
      kill(pid_, SIGCONT);
      waitpid(pid_, nullptr, 0);
    }
  }
  pid_t launcher() const { return pid_; }
  const std::string& output() const { return output_; }

  // Reads the launch's output until both ranks said they joined; returns their pids (rank order).
  std::vector<pid_t> wait_until_joined() {
    static const std::regex joined(R"(\[rank(\d)\]: rank \d joined, pid (\d+))");
    std::vector<pid_t> pids(2, 0);
    char buffer[4096];
    while (pids[0] == 0 || pids[1] == 0) {
      const ssize_t n = read(fd_, buffer, sizeof buffer);
      if (n <= 0) return {};
      output_.append(buffer, size_t(n));
      for (std::sregex_iterator it(output_.begin(), output_.end(), joined), end; it != end; ++it)
        pids[size_t(std::stoi((*it)[1]))] = pid_t(std::stol((*it)[2]));
    }
    return pids;
  }
  // Reads the rest of the output and reaps the launcher: its wait status.
  int finish() {
    char buffer[4096];
    for (ssize_t n; (n = read(fd_, buffer, sizeof buffer)) > 0;) output_.append(buffer, size_t(n));
    int status = 0;
    waitpid(pid_, &status, 0);
    reaped_ = true;
    return status;
  }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  bool reaped_ = false;
  std::string output_;
};

// Whether `pid` (not this process's child) has ended, waiting up to 20 s: /proc says zombie or gone.
static bool ended_within_20s(pid_t pid) {
  for (int i = 0; i < 2000; ++i) {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    if (!std::getline(stat, line)) return true;
    const size_t close_paren = line.rfind(')');
    if (close_paren != std::string::npos && line.size() > close_paren + 2 && line[close_paren + 2] == 'Z') return true;
    usleep(10 * 1000);
  }
  return false;
}

// Rank 1 dies of a SIGKILL no one in the job sent (the OOM killer's way) and rank 0, in the allreduce,
// loses its peer and exits, both while the launcher is stopped (SIGSTOP): once it runs again it
// reaps rank 0 first (its workers' order) and starts stopping the others, then rank 1. Rank 1's
// death is still the cause, not a worker the launcher stopped, and rank 0 comes after it.
TEST(Launcher, AWorkerKilledFromOutsideIsTheCauseWhenItsPeerIsReapedFirst) {
  LiveLaunch launch;
  const std::vector<pid_t> pids = launch.wait_until_joined();
  ASSERT_EQ(pids.size(), 2u) << launch.output();
  ASSERT_EQ(kill(launch.launcher(), SIGSTOP), 0);
  ASSERT_EQ(kill(pids[1], SIGKILL), 0);
  ASSERT_TRUE(ended_within_20s(pids[1]));
  ASSERT_TRUE(ended_within_20s(pids[0])) << "rank 0 did not notice its peer's death";
  ASSERT_EQ(kill(launch.launcher(), SIGCONT), 0);
  const int status = launch.finish();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << launch.output();
  static const std::regex order(R"(job failed: rank 1 \(node0, pid \d+\) was killed by signal Killed \(not by its parent.*)"
                                R"(; after it: rank 0 \(node0, pid \d+\) exited with code 1: .*a peer failed or the network broke)");
  EXPECT_TRUE(std::regex_search(launch.output(), order)) << launch.output();
}

// Ctrl-C in a terminal: SIGINT to the launcher's whole process group, its workers with it, once
// both have joined. They die of the same signal the launcher got; no rank is blamed for it, and the
// launcher says it was interrupted and exits as a shell reports SIGINT (130).
TEST(Launcher, AnInterruptOfTheWholeProcessGroupBlamesNoRank) {
  LiveLaunch launch;
  ASSERT_EQ(launch.wait_until_joined().size(), 2u) << launch.output();
  ASSERT_EQ(kill(-launch.launcher(), SIGINT), 0);
  const int status = launch.finish();
  ASSERT_TRUE(WIFEXITED(status)) << launch.output();
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGINT) << launch.output();
  EXPECT_NE(launch.output().find("ktune launcher (node0): interrupted by Interrupt; stopped the workers"), std::string::npos)
      << launch.output();
  EXPECT_EQ(launch.output().find("job failed"), std::string::npos) << launch.output();
}

// A hang-up (the terminal closed, the SSH session dropped) to the launcher alone stops the workers,
// as torchrun does: none outlives it, and no rank is blamed.
TEST(Launcher, AHangUpToTheLauncherStopsItsWorkers) {
  LiveLaunch launch;
  const std::vector<pid_t> pids = launch.wait_until_joined();
  ASSERT_EQ(pids.size(), 2u) << launch.output();
  ASSERT_EQ(kill(launch.launcher(), SIGHUP), 0);
  const int status = launch.finish();
  ASSERT_TRUE(WIFEXITED(status)) << launch.output();
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGHUP) << launch.output();
  EXPECT_NE(launch.output().find("interrupted by Hangup; stopped the workers"), std::string::npos) << launch.output();
  for (pid_t pid : pids) EXPECT_TRUE(ended_within_20s(pid)) << "worker " << pid << " outlived its launcher";
}

// A launcher killed outright (it cannot stop anything) still takes its workers with it.
TEST(Launcher, WorkersDoNotOutliveAKilledLauncher) {
  LiveLaunch launch;
  const std::vector<pid_t> pids = launch.wait_until_joined();
  ASSERT_EQ(pids.size(), 2u) << launch.output();
  ASSERT_EQ(kill(launch.launcher(), SIGKILL), 0);
  launch.finish();
  for (pid_t pid : pids) EXPECT_TRUE(ended_within_20s(pid)) << "worker " << pid << " outlived its launcher";
}

TEST(Launcher, TwoNodesOnLoopbackFormOneWorld) {
  std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  auto node1 = std::async(std::launch::async, [&] { return run("2 1 1 " + endpoint + " ok"); });
  Result node0 = run("2 1 0 " + endpoint + " ok");
  Result r1 = node1.get();
  EXPECT_EQ(node0.exit_code, 0) << node0.output;
  EXPECT_EQ(r1.exit_code, 0) << r1.output;
  EXPECT_NE(node0.output.find("[rank0]: rank 0 of 2 sum 3"), std::string::npos) << node0.output;
  EXPECT_NE(r1.output.find("[rank1]: rank 1 of 2 sum 3"), std::string::npos) << r1.output;
}

TEST(Launcher, AFailureOnOneNodeEndsTheJobOnEveryNode) {
  std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  auto node1 = std::async(std::launch::async, [&] { return run("2 1 1 " + endpoint + " fail1"); });
  Result node0 = run("2 1 0 " + endpoint + " fail1");
  Result r1 = node1.get();
  EXPECT_NE(node0.exit_code, 0) << node0.output;
  EXPECT_NE(r1.exit_code, 0) << r1.output;
  EXPECT_NE(node0.output.find("job failed: rank 1 (node1"), std::string::npos) << node0.output;
  EXPECT_NE(r1.output.find("exited with code 3"), std::string::npos) << r1.output;
}

// KTUNE_COLLECTIVE_TIMEOUT bounds how long a worker's collectives wait for a late peer (a rank 0
// still writing a checkpoint): a 2 s timeout ends rank 1's allreduce while rank 0 sleeps 6 s, a
// 20 s one waits it out, and a value that is not a count of seconds is refused naming the env.
TEST(Launcher, TheCollectiveTimeoutComesFromTheEnvAndBoundsTheWaitForALatePeer) {
  Result patient = run("1 2 0 standalone slow0", "KTUNE_COLLECTIVE_TIMEOUT=20");
  EXPECT_EQ(patient.exit_code, 0) << patient.output;
  EXPECT_NE(patient.output.find("[rank1]: rank 1 of 2 sum 3"), std::string::npos) << patient.output;

  // 4 s (below slow0's 6 s): the timeout also bounds the forming of the group, which a slow start
  // of one worker (a sanitizer build's, on a loaded machine) must not exceed.
  Result impatient = run("1 2 0 standalone slow0", "KTUNE_COLLECTIVE_TIMEOUT=4");
  EXPECT_NE(impatient.exit_code, 0) << impatient.output;
  EXPECT_EQ(impatient.output.find("rank 1 of 2 sum 3"), std::string::npos) << impatient.output;
  EXPECT_NE(impatient.output.find("rank 1 of 2: a peer did not take part within the collectives' timeout of 4 s "
                                  "(env KTUNE_COLLECTIVE_TIMEOUT)"),
            std::string::npos)
      << impatient.output;

  Result bad = run("1 2 0 standalone ok", "KTUNE_COLLECTIVE_TIMEOUT=soon");
  EXPECT_NE(bad.exit_code, 0) << bad.output;
  EXPECT_NE(bad.output.find("env KTUNE_COLLECTIVE_TIMEOUT"), std::string::npos) << bad.output;
}
