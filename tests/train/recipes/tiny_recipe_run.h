// Running the recipes through the built `ktune` binary on the quickstart's tiny model, shared by the
// end-to-end suites (tests/train/recipes, tests/train/bf16, tests/train/device): a shell runner, a
// fixture that makes a fresh model in a temporary directory per test, the `ktune run` command line
// pointed at it, copies of the model in another dtype, the metrics a run logged and the bytes of
// the checkpoints it wrote.
// It deliberately asserts nothing about the runs: each suite says what it expects of them.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "io/safetensors.h"

namespace ktune::recipe_testing {

namespace fs = std::filesystem;

struct Outcome {
  int exit_code;
  std::string output;  // stdout and stderr together
};

inline Outcome sh(const std::string& command) {
  Outcome r{-1, ""};
  std::FILE* p = popen((command + " 2>&1").c_str(), "r");
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, p)) > 0) r.output.append(buffer, n);
  int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

inline const std::string kSource = KTUNE_SOURCE_DIR;
inline const std::string kKtune = std::string(KTUNE_BINARY_DIR) + "/bin/ktune";

// A fresh tiny model (the quickstart's, seed 3) in a temporary directory per test.
class TinyModelRecipeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("ktune_" + std::string(test->test_suite_name()) + "_" + std::to_string(getpid()) + "_" + test->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    Outcome r = sh(kKtune + " init-model --config " + kSource + "/examples/quickstart/config.json --output-dir " + model() +
                   " --seed 3 --copy " + kSource + "/examples/quickstart/tokenizer.json --copy " + kSource +
                   "/examples/quickstart/tokenizer_config.json");
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string model() const { return (dir_ / "model").string(); }
  std::string out(const std::string& name = "out") const { return (dir_ / name).string(); }

  // `ktune run LAUNCHER RECIPE --config tiny/CONFIG` pointed at this test's model, the bundled
  // quickstart data and OUTPUT, with seed 7; EXTRA (key=value …) comes last, so it wins.
  Outcome run_tiny(const std::string& launcher, const std::string& recipe, const std::string& config,
                   const std::string& extra, const std::string& output) const {
    return sh(kKtune + " run " + launcher + " " + recipe + " --config tiny/" + config + " output_dir=" + output +
              " checkpointer.checkpoint_dir=" + model() + " tokenizer.path=" + model() + "/tokenizer.json" +
              " dataset=torchtune.datasets.alpaca_dataset dataset.source=json dataset.data_files=" + kSource +
              "/data/quickstart/jsonl/train.jsonl seed=7 " + extra);
  }

  fs::path dir_;
};

// `copy`: the model in `from` (its model.safetensors and every other file) with its values converted
// to `dtype`, rounded as a load in that dtype rounds them (from f16 to bf16 once, from the exact
// widening). Returns `copy`.
inline std::string copy_of_model(const std::string& from, const std::string& copy, DType dtype) {
  fs::create_directories(copy);
  for (const auto& e : fs::directory_iterator(from))
    if (e.path().extension() != ".safetensors") fs::copy_file(e.path(), fs::path(copy) / e.path().filename());
  io::SafetensorsFile file = io::SafetensorsFile::open(from + "/model.safetensors");
  std::vector<io::NamedTensor> converted;
  for (const std::string& name : file.names()) converted.push_back({name, file.to_f32(name).to(dtype)});
  io::write_safetensors(copy + "/model.safetensors", converted, {{"format", "pt"}});
  return copy;
}

// The bytes of every safetensors file under DIR (the model, the recipe state's weights and moments),
// by path relative to it.
inline std::map<std::string, std::string> safetensors_bytes(const std::string& dir) {
  std::map<std::string, std::string> result;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.path().extension() != ".safetensors") continue;
    std::ifstream in(e.path(), std::ios::binary);
    result[fs::relative(e.path(), dir).string()] =
        std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return result;
}

// Step → `metric` ("loss", "val_loss") as a run's log_<unix>.txt wrote it: the text, so that
// bit-exact runs can be compared digit for digit.
inline std::map<int, std::string> logged(const std::string& output_dir, const std::string& metric = "loss") {
  std::map<int, std::string> result;
  for (const auto& e : fs::directory_iterator(fs::path(output_dir) / "logs")) {
    if (e.path().filename().string().rfind("log_", 0) != 0) continue;
    std::ifstream in(e.path());
    std::string line;
    const std::regex pattern("Step (\\d+) \\|.* " + metric + ":([0-9.eE+-]+)");  // any metric of the line
    std::smatch m;
    while (std::getline(in, line))
      if (std::regex_search(line, m, pattern)) result[std::stoi(m[1])] = m[2];
  }
  return result;
}

// The same as numbers.
inline std::map<int, double> losses(const std::string& output_dir, const std::string& metric = "loss") {
  std::map<int, double> result;
  for (const auto& [step, text] : logged(output_dir, metric)) result[step] = std::stod(text);
  return result;
}

}  // namespace ktune::recipe_testing
