// A followed log whose stream the fake API server (tests/sdk/kube_api_server.py) cuts mid-line or
// ends early while the container runs: the backend reopens it with timestamps and sinceTime and
// every line arrives exactly once, in order (lines sharing a timestamp included); a container that
// ended while the stream was down has its rest read once; a stream that keeps failing gives up.
// It does not test the kubelet's own log rotation (a reopened stream reads the current file).
#include "kube_test_support.h"

#include <regex>

namespace ktune::sdk {
namespace {

using namespace kube_testing;  // NOLINT: the shared fixture and helpers (fs, Json, TempDir, write_file, run_command)

struct FollowedLog {
  std::vector<std::string> lines, log_paths;
};

class KubernetesLogStreamTest : public KubernetesBackendTest {
 protected:
  // A running node pod of job `job` whose log is `log` (the fake server's LOG spec); follows it.
  FollowedLog follow(const std::string& job, Json log) {
    FollowedLog out;
    if (submit(job) != job) return out;
    const Json node = pod(job, "node", 0, "Running", "2026-12-02T10:02:00Z");
    const std::string pod_name = node["metadata"]["name"];
    set_state({{"pods", {{job, Json::array({node})}}}, {"logs", {{pod_name + "/node", log}}}});
    KubernetesBackend k = backend();
    k.set_poll_interval(0.01);
    k.get_job_logs(job, "node-0", true, [&](const std::string& l) {
      out.lines.push_back(l);
      return true;
    });
    const Json recorded = requests();
    for (const Json& r : recorded["requests"]) {
      const std::string path = r["path"];
      if (path.find("/log?") != std::string::npos) out.log_paths.push_back(path.substr(path.find("/log?") + 5));
    }
    return out;
  }
};

std::vector<std::string> numbered_lines(int n) {
  std::vector<std::string> v;
  for (int i = 0; i < n; ++i) v.push_back("line " + std::to_string(i) + ": loss " + std::to_string(2.5 - 0.1 * i));
  return v;
}

// Cut mid-line after the second of three lines that share one timestamp, then ended early by the
// server while the container still runs: each time the stream is reopened from the last line's
// second, and every line arrives exactly once, in order.
TEST_F(KubernetesLogStreamTest, ACutOrEarlyEndedStreamIsReopenedWithoutRepeatsOrGaps) {
  const std::vector<std::string> lines = numbered_lines(10);
  const Json times = Json::array({"2026-12-02T10:02:00.1Z", "2026-12-02T10:02:00.5Z", "2026-12-02T10:02:01Z",
                                  "2026-12-02T10:02:01.5Z", "2026-12-02T10:02:01.5Z", "2026-12-02T10:02:01.5Z",
                                  "2026-12-02T10:02:01.9Z", "2026-12-02T10:02:02.3Z", "2026-12-02T10:02:03Z",
                                  "2026-12-02T10:02:03.000000001Z"});
  const FollowedLog got = follow("job-cut", {{"lines", lines},
                                             {"times", times},
                                             {"drops", Json::array({{{"at", 5}, {"how", "reset"}, {"partial", true}},
                                                                    {{"at", 8}, {"how", "clean"}}})}});
  EXPECT_EQ(got.lines, lines);
  EXPECT_EQ(got.log_paths, (std::vector<std::string>{"container=node&timestamps=true&follow=true",
                                                     "container=node&timestamps=true&sinceTime=2026-12-02T10%3A02%3A01Z&follow=true",
                                                     "container=node&timestamps=true&sinceTime=2026-12-02T10%3A02%3A02Z&follow=true",
                                                     "container=node&timestamps=true&sinceTime=2026-12-02T10%3A02%3A03Z"}));
}

// The pod is evicted mid-stream and JobSet starts another for the step: the follow goes on with the
// replacement's log from its start (the step ran again), saying so, instead of ending quietly.
TEST_F(KubernetesLogStreamTest, APodReplacedMidStreamIsFollowedInItsReplacement) {
  const std::vector<std::string> first = numbered_lines(6), second = {"restarted: step 1", "restarted: step 2"};
  const std::string job = "job-evicted";
  ASSERT_EQ(submit(job), job);
  const Json node = pod(job, "node", 0, "Running", "2026-12-02T10:02:00Z");
  const std::string evicted = node["metadata"]["name"], replacement = evicted + "-r";
  set_state({{"pods", {{job, Json::array({node})}}},
             {"logs", {{evicted + "/node", {{"lines", first}, {"drops", Json::array({{{"at", 3}, {"replaced_by", replacement}}})}}},
                       {replacement + "/node", {{"lines", second}}}}}});
  KubernetesBackend k = backend();
  k.set_poll_interval(0.01);
  std::vector<std::string> lines;
  testing::internal::CaptureStderr();
  k.get_job_logs(job, "node-0", true, [&](const std::string& l) { return lines.push_back(l), true; });
  const std::string warned = testing::internal::GetCapturedStderr();
  EXPECT_EQ(lines, (std::vector<std::string>{first[0], first[1], first[2], second[0], second[1]}));
  EXPECT_NE(warned.find("the pod " + evicted + " of " + job + "/node-0 is gone; following its replacement " + replacement +
                        " from its start"), std::string::npos) << warned;
}

// The stream is cut and the container exits before it could be reopened: the rest is read once,
// without follow, from where the cut left off.
TEST_F(KubernetesLogStreamTest, ACutStreamOfAContainerThatEndedMeanwhileIsReadToItsEnd) {
  const std::vector<std::string> lines = numbered_lines(7);
  const FollowedLog got =
      follow("job-end", {{"lines", lines}, {"drops", Json::array({{{"at", 4}, {"partial", true}, {"container_ends", true}}})}});
  EXPECT_EQ(got.lines, lines);
  ASSERT_EQ(got.log_paths.size(), 2u);
  EXPECT_EQ(got.log_paths[1], "container=node&timestamps=true&sinceTime=2026-12-02T10%3A02%3A01Z");  // no follow
}

// A stream that keeps failing without a new line gives up with the reason instead of looping.
TEST_F(KubernetesLogStreamTest, AStreamThatKeepsFailingGivesUpWithTheReason) {
  Json drops = Json::array();
  for (int i = 0; i < 8; ++i) drops.push_back({{"at", 2}});
  std::string error;
  FollowedLog got;
  try {
    got = follow("job-flaky", {{"lines", numbered_lines(4)}, {"drops", drops}});
  } catch (const Error& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("keeps failing (5 attempts without a new line)"), std::string::npos) << error;
  EXPECT_EQ(requests()["requests"].back()["method"], "GET");
}

}  // namespace
}  // namespace ktune::sdk
