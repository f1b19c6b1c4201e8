#include "train/metric_logger.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
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
