// The trainer status body (Kubeflow Trainer's KEP-2779 shape) and when a run reports at all. The
// whole path (TLS, bearer token, the controller's validation, the TrainJob's status, a refusal) is
// tests/sdk/kubernetes_backend_test.cpp's TheTrainerReportsItsProgressIntoTheTrainJobsStatus.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "train/trainer_status.h"

namespace ktune {
namespace {

using nlohmann::json;

TEST(TrainerStatus, BodyHasTheControllersShape) {
  TrainerProgress p;
  p.step = 7, p.total_steps = 20, p.epoch = 1, p.total_epochs = 2;
  p.metrics = {{"loss", 1.25}, {"lr", 3e-05}, {"grad_norm", std::numeric_limits<double>::quiet_NaN()}};
  const json body = json::parse(trainer_status_body(p, 12.6, 1796601600));
  ASSERT_EQ(body.size(), 1u);
  const json& ts = body["trainerStatus"];
  EXPECT_EQ(ts["progressPercentage"], 35);  // 7 of 20, rounded down
  EXPECT_EQ(ts["estimatedRemainingSeconds"], 13);
  EXPECT_EQ(ts["lastUpdatedTime"], "2026-12-07T00:00:00Z");
  const json expected_metrics = json::array({{{"name", "loss"}, {"value", "1.25"}},
                                             {{"name", "lr"}, {"value", "3e-05"}},  // as the DiskLogger writes it
                                             {{"name", "currentStep"}, {"value", "7"}},
                                             {{"name", "totalSteps"}, {"value", "20"}},
                                             {{"name", "currentEpoch"}, {"value", "2"}},  // 1-based, as shown
                                             {{"name", "totalEpochs"}, {"value", "2"}}});
  EXPECT_EQ(ts["metrics"], expected_metrics);  // NaN left out: a value must be a number's text

  // Unknown remaining time and total: those fields are left out; never above 100%.
  p.total_steps = 0;
  const json unknown = json::parse(trainer_status_body(p, std::nullopt, 0))["trainerStatus"];
  EXPECT_FALSE(unknown.contains("progressPercentage"));
  EXPECT_FALSE(unknown.contains("estimatedRemainingSeconds"));
  p.total_steps = 5, p.step = 6;
  EXPECT_EQ(json::parse(trainer_status_body(p, -3.0, 0))["trainerStatus"]["progressPercentage"], 100);
  EXPECT_EQ(json::parse(trainer_status_body(p, -3.0, 0))["trainerStatus"]["estimatedRemainingSeconds"], 0);
}

TEST(TrainerStatus, OnlyRankZeroReportsAndOnlyWhereTheControllerAsks) {
  unsetenv("KUBEFLOW_TRAINER_SERVER_URL");
  unsetenv("KUBEFLOW_TRAINER_STATUS_URL");
  EXPECT_EQ(TrainerStatusReporter::from_env(0), nullptr);
  setenv("KUBEFLOW_TRAINER_STATUS_URL", "https://127.0.0.1:1/status", 1);  // the KEP's spelling
  EXPECT_NE(TrainerStatusReporter::from_env(0), nullptr);
  unsetenv("KUBEFLOW_TRAINER_STATUS_URL");
  setenv("KUBEFLOW_TRAINER_SERVER_URL", "https://127.0.0.1:1/status", 1);  // upstream's SDK's
  EXPECT_EQ(TrainerStatusReporter::from_env(1), nullptr);
  setenv("KTUNE_TRAINER_STATUS_INTERVAL_SECONDS", "soon", 1);
  try {
    TrainerStatusReporter::from_env(0);
    ADD_FAILURE() << "a bad interval was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KTUNE_TRAINER_STATUS_INTERVAL_SECONDS"), std::string::npos) << e.what();
  }
  setenv("KTUNE_TRAINER_STATUS_INTERVAL_SECONDS", "0", 1);
  // Nothing listens on port 1: the send fails, the reporter gives up within its wait, nothing throws.
  std::unique_ptr<TrainerStatusReporter> r = TrainerStatusReporter::from_env(0);
  ASSERT_NE(r, nullptr);
  r->report(1, 2, 0, 1, {{"loss", 2.0}});
  r->report(2, 2, 0, 1, {{"loss", 1.0}});
  r->finish(5);
  EXPECT_EQ(r->sent(), 0);
  unsetenv("KUBEFLOW_TRAINER_SERVER_URL");
  unsetenv("KTUNE_TRAINER_STATUS_INTERVAL_SECONDS");
}

}  // namespace
}  // namespace ktune
