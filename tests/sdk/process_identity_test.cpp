// Process identity under churn: the /proc scans the local backend makes (is the recorded process
// still alive, which members of a step's process group are left) read /proc/<pid>/stat of
// processes that may exit between open() and read(). The kernel then answers read() with ESRCH;
// that must count as "gone", never throw (a CI run once failed `ktune jobs delete` this way:
// "basic_filebuf::underflow error reading the file: No such process").
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "sdk/process_identity.h"

namespace ktune::sdk {
namespace {

// Forks children that exit at once and reaps them, as fast as it can, until told to stop or `most`
// are made (a bound: pids are few, 32768 on some machines, and other tests' processes need them).
class ProcessChurn {
 public:
  explicit ProcessChurn(long most) : most_(most), thread_([this] { run(); }) {}
  ~ProcessChurn() { stop(); }
  void stop() {
    done_ = true;
    if (thread_.joinable()) thread_.join();
  }
  bool running() const { return !done_; }
  long made() const { return made_; }
  int last_pid() const { return last_pid_; }

 private:
  void run() {
    while (!done_ && made_ < most_) {
      pid_t pid = fork();
      if (pid == 0) _exit(0);
      if (pid < 0) continue;
      last_pid_ = pid;
      waitpid(pid, nullptr, 0);
      ++made_;
    }
    done_ = true;
  }
  const long most_;
  std::atomic<bool> done_{false};
  std::atomic<long> made_{0};
  std::atomic<int> last_pid_{0};
  std::thread thread_;
};

TEST(ProcessIdentity, ProcessesThatExitWhileProcIsScannedCountAsGoneAndNeverThrow) {
  // A process group of our own that stays alive, so every scan walks the whole of /proc and
  // finds it: a live member among hundreds that come and go.
  pid_t sleeper = fork();
  ASSERT_GE(sleeper, 0);
  if (sleeper == 0) {
    setpgid(0, 0);
    pause();
    _exit(0);
  }
  setpgid(sleeper, sleeper);
  const long long sleeper_start = process_start_time(sleeper);
  ASSERT_NE(sleeper_start, 0);

  ProcessChurn churn(/*most=*/3000);
  long scans = 0;
  // Until both sides have done enough to race (at least 3 s of it), or 20 s on a starved machine.
  const auto start = std::chrono::steady_clock::now();
  const auto enough = [&] {
    const auto ran = std::chrono::steady_clock::now() - start;
    return (ran > std::chrono::seconds(3) && churn.made() > 100 && scans > 10) || ran > std::chrono::seconds(20);
  };
  while (churn.running() && !enough()) {
    // A group with no member (the churn's children are in ours): nothing to stop.
    EXPECT_NO_THROW(EXPECT_FALSE(stop_process_group(churn.last_pid(), 0, 0.0)));
    EXPECT_NO_THROW(process_is_alive(churn.last_pid(), 0));
    EXPECT_TRUE(process_is_alive(sleeper, sleeper_start));
    ++scans;
  }
  churn.stop();
  EXPECT_GT(churn.made(), 100) << "the churn made too few processes to race the scans";
  EXPECT_GT(scans, 10);

  // The sleeper's group is stopped: SIGTERM ends it within the grace, so no SIGKILL.
  EXPECT_FALSE(stop_process_group(sleeper, sleeper_start, 5.0));
  int status = 0;
  ASSERT_EQ(waitpid(sleeper, &status, 0), sleeper);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGTERM);
  EXPECT_EQ(process_start_time(sleeper), 0);
}

}  // namespace
}  // namespace ktune::sdk
