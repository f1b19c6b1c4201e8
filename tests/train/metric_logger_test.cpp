#include "train/metric_logger.h"
#include "train/tensorboard_events.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <tuple>
#include <vector>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

using namespace ktune;

static std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

static std::string temp_dir(const char* name) {
  auto dir = std::filesystem::temp_directory_path() / (std::string("ktune_") + name + "_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  return dir.string();
}

TEST(MetricLogger, WritesTorchtuneStyleLinesAndJsonl) {
  std::string dir = temp_dir("metrics");
  {
    MetricLogger logger(dir, 1700000000);
    logger.log(1, {{"loss", 2.36971}, {"lr", 3e-5}, {"tokens_per_second_per_gpu", 1024.0}});
    logger.log(2, {{"loss", 2.1}, {"lr", 6e-5}, {"tokens_per_second_per_gpu", 1000.5}});
  }
  std::string text = read_all(dir + "/log_1700000000.txt");
  EXPECT_EQ(text,
            "Step 1 | loss:2.36971 lr:3e-05 tokens_per_second_per_gpu:1024.0 \n"
            "Step 2 | loss:2.1 lr:6e-05 tokens_per_second_per_gpu:1000.5 \n");
  std::ifstream jsonl(dir + "/metrics_1700000000.jsonl");
  std::string line;
  std::getline(jsonl, line);
  auto record = nlohmann::json::parse(line);
  EXPECT_EQ(record["step"], 1);
  EXPECT_DOUBLE_EQ(record["loss"].get<double>(), 2.36971);
  std::filesystem::remove_all(dir);
}

TEST(MetricLogger, AppendsProgressWhenTheBackendAsksForIt) {
  std::string dir = temp_dir("progress");
  std::filesystem::create_directories(dir);
  std::string progress = dir + "/progress.jsonl";
  setenv("KTUNE_PROGRESS_FILE", progress.c_str(), 1);
  {
    MetricLogger logger(dir, 1);
    logger.progress(3, 10, 1, 1.5, 1e-4, 250.0);
  }
  unsetenv("KTUNE_PROGRESS_FILE");
  auto record = nlohmann::json::parse(read_all(progress));
  EXPECT_EQ(record["step"], 3);
  EXPECT_EQ(record["total_steps"], 10);
  EXPECT_DOUBLE_EQ(record["tokens_per_second"].get<double>(), 250.0);
  std::filesystem::remove_all(dir);
}

TEST(MetricLogger, NamesTheDirectoryItCannotCreate) {
  try {
    MetricLogger logger("/proc/ktune_cannot_exist/logs", 1);
    FAIL();
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("/proc/ktune_cannot_exist/logs"), std::string::npos);
  }
}

// The TFRecords of an event file: each record's bytes, after checking both its CRCs.
static std::vector<std::string> tf_records(const std::string& path) {
  const std::string bytes = read_all(path);
  std::vector<std::string> records;
  for (size_t at = 0; at < bytes.size();) {
    uint64_t length = 0;
    uint32_t length_crc = 0, data_crc = 0;
    EXPECT_LE(at + 12, bytes.size()) << path;
    if (at + 12 > bytes.size()) break;
    std::memcpy(&length, bytes.data() + at, 8);
    std::memcpy(&length_crc, bytes.data() + at + 8, 4);
    EXPECT_EQ(length_crc, masked_crc32c(bytes.data() + at, 8)) << path << " at " << at;
    EXPECT_LE(at + 16 + length, bytes.size()) << path;
    if (at + 16 + length > bytes.size()) break;
    records.push_back(bytes.substr(at + 12, length));
    std::memcpy(&data_crc, bytes.data() + at + 12 + length, 4);
    EXPECT_EQ(data_crc, masked_crc32c(records.back().data(), records.back().size())) << path << " at " << at;
    at += 16 + length;
  }
  return records;
}

TEST(TensorBoardEvents, Crc32cIsCastagnolis) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);  // the CRC catalogue's check value
  EXPECT_EQ(crc32c("", 0), 0u);
}

// The scalars torch's SummaryWriter wrote into the fixture (make_tensorboard_events.py, the same
// table) are written record for record alike; the file-version event (first) names its writer.
TEST(TensorBoardEvents, ScalarsAreTorchsSummaryWritersByteForByte) {
  const std::vector<std::tuple<std::string, double, int64_t, double>> scalars = {
      {"loss", 2.36971, 1, 1700000000.25},  {"lr", 3e-05, 1, 1700000000.25},
      {"tokens_per_second_per_gpu", 1024.0, 1, 1700000000.25},
      {"loss", 2.1, 2, 1700000001.5},       {"lr", 6e-05, 2, 1700000001.5},
      {"val_loss", 1.875, 300, 1700000123.0}, {"loss", std::numeric_limits<double>::quiet_NaN(), 0, 1700000200.0}};
  const std::string dir = temp_dir("tensorboard");
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/" + tensorboard_event_file_name(1700000000);
  {
    TensorBoardEventWriter writer(path, 1699999999.5);
    for (const auto& [tag, value, step, wall_time] : scalars) writer.add_scalar(tag, value, step, wall_time);
  }
  const std::vector<std::string> ours = tf_records(path);
  const std::vector<std::string> torchs =
      tf_records(std::string(KTUNE_SOURCE_DIR) + "/tests/train/fixtures/tensorboard_scalars.tfevents");
  ASSERT_EQ(ours.size(), scalars.size() + 1);
  ASSERT_EQ(torchs.size(), ours.size()) << "fixture missing or stale: run tests/train/fixtures/make_tensorboard_events.py";
  for (size_t i = 1; i < ours.size(); ++i) EXPECT_EQ(ours[i], torchs[i]) << "record " << i;
  EXPECT_NE(ours[0].find("brain.Event:2"), std::string::npos);
  EXPECT_NE(ours[0].find("ktune"), std::string::npos);
  EXPECT_NE(std::filesystem::path(path).filename().string().find("events.out.tfevents.1700000000."), std::string::npos);
  std::filesystem::remove_all(dir);
}

// metric_logger: TensorBoardLogger writes its events into log_dir/run_0_<time> (organize_logs) with
// the JSON-lines twin beside; DiskLogger's `filename` names its text file; StdoutLogger prints.
TEST(MetricLogger, TensorBoardAndFilenameAsTorchtunesLoggers) {
  const std::string dir = temp_dir("tb_logger");
  {
    MetricLogger logger(MetricLoggerOptions{MetricSink::TensorBoard, dir, "", true}, 1700000000);
    logger.log(1, {{"loss", 2.5}, {"lr", 1e-4}});
    logger.log(2, {{"loss", 2.25}, {"lr", 2e-4}});
    const std::filesystem::path events = logger.tensorboard_path();
    EXPECT_EQ(events.parent_path().parent_path(), std::filesystem::path(dir));
    EXPECT_EQ(events.parent_path().filename().string().rfind("run_0_", 0), 0u) << events;
    EXPECT_EQ(tf_records(events.string()).size(), 5u);  // the version, then 2 scalars a step
    EXPECT_TRUE(logger.text_path().empty());
    EXPECT_TRUE(std::filesystem::exists(dir + "/metrics_1700000000.jsonl"));
  }
  {
    MetricLogger logger(MetricLoggerOptions{MetricSink::TensorBoard, dir + "/flat", "", false}, 1700000000);
    EXPECT_EQ(std::filesystem::path(logger.tensorboard_path()).parent_path(), std::filesystem::path(dir + "/flat"));
  }
  {
    MetricLogger logger(MetricLoggerOptions{MetricSink::Disk, dir, "my_log.txt", true}, 1700000000);
    logger.log(7, {{"loss", 1.0}});
  }
  EXPECT_EQ(read_all(dir + "/my_log.txt"), "Step 7 | loss:1.0 \n");
  testing::internal::CaptureStdout();  // StdoutLogger: the same line on stdout
  {
    MetricLogger logger(MetricLoggerOptions{MetricSink::Stdout, dir, "", true}, 1700000001);
    logger.log(8, {{"loss", 0.5}, {"lr", 3e-05}});
    EXPECT_TRUE(logger.text_path().empty());
  }
  EXPECT_EQ(testing::internal::GetCapturedStdout(), "Step 8 | loss:0.5 lr:3e-05 \n");
  std::filesystem::remove_all(dir);
}
