// `ktune ls`, `cp`, `cat`, `validate` (their cmd_*.cpp are compiled into this test).
#include <gtest/gtest.h>

#include <filesystem>
#include <iterator>
#include <fstream>
#include <sstream>

#include "cli/command_table.h"
#include "core/error.h"

namespace ktune::cli {
int cmd_ls(const Args& args);
int cmd_cp(const Args& args);
int cmd_cat(const Args& args);
int cmd_validate(const Args& args);
}  // namespace ktune::cli

using namespace ktune::cli;
namespace fs = std::filesystem;

namespace {
std::string run_captured(int (*cmd)(const Args&), const Args& args, int* rc = nullptr) {
  testing::internal::CaptureStdout();
  int code = cmd(args);
  if (rc) *rc = code;
  return testing::internal::GetCapturedStdout();
}
fs::path scratch(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("ktune_cli_test_" + std::to_string(::getpid())) / name;
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}
}  // namespace

TEST(ConfigCli, LsPrintsTorchtunesTable) {
  std::string out = run_captured(cmd_ls, {});
  std::istringstream lines(out);
  std::string first, second;
  std::getline(lines, first);
  EXPECT_EQ(first, std::string("RECIPE") + std::string(35, ' ') + "CONFIG" + std::string(34, ' '));
  EXPECT_NE(out.find(std::string("full_finetune_single_device") + std::string(14, ' ') + "gemma2/27B_full_single_device"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find(std::string(41, ' ') + "llama3_2/1B_lora_single_device"), std::string::npos);
  EXPECT_NE(out.find("lora_finetune_distributed"), std::string::npos);
  std::size_t rows = 0;
  for (char c : out) rows += c == '\n';
  EXPECT_EQ(rows, 1u + 82u);
}

TEST(ConfigCli, CpCopiesConfigAndRefusesRecipes) {
  fs::path dir = scratch("cp");
  std::string out = run_captured(cmd_cp, {"llama3_2/1B_lora_single_device", (dir / "my_config").string()});
  EXPECT_NE(out.find("Copied file to"), std::string::npos);
  ASSERT_TRUE(fs::exists(dir / "my_config.yaml"));
  run_captured(cmd_cp, {"qwen2_5/0.5B_full", dir.string()});
  EXPECT_TRUE(fs::exists(dir / "0.5B_full.yaml"));
  run_captured(cmd_cp, {"qwen2_5/0.5B_full", (dir / "not_a_folder").string() + "/"});  // torchtune: not_a_folder.yaml
  EXPECT_TRUE(fs::exists(dir / "not_a_folder.yaml"));
  out = run_captured(cmd_cp, {"-n", "llama3_2/1B_full", (dir / "my_config.yaml").string()});
  EXPECT_NE(out.find("not overwriting"), std::string::npos);
  EXPECT_THROW(cmd_cp({"llama3_2/1B_full", (dir / "a/b/c.yaml").string()}), ktune::Error);
  run_captured(cmd_cp, {"--make-parents", "llama3_2/1B_full", (dir / "a/b/c.yaml").string()});
  EXPECT_TRUE(fs::exists(dir / "a/b/c.yaml"));
  try {
    cmd_cp({"lora_finetune_single_device", dir.string()});
    FAIL();
  } catch (const ktune::Error& e) {
    EXPECT_NE(std::string(e.what()).find("recipes are native C++"), std::string::npos) << e.what();
  }
  try {
    cmd_cp({"llama3_2/1B_lora_single_devic", dir.string()});
    FAIL();
  } catch (const ktune::Error& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean `llama3_2/1B_lora_single_device`?"), std::string::npos);
  }
}

TEST(ConfigCli, CatPrintsConfigWithCommentsOrSorted) {
  std::string out = run_captured(cmd_cat, {"llama3_2/1B_lora_single_device"});
  EXPECT_NE(out.find("# Config for lora_finetune_single_device"), std::string::npos);
  EXPECT_NE(out.find("lora_rank: 64"), std::string::npos);
  out = run_captured(cmd_cat, {"llama3_2/1B_lora_single_device", "--sort"});
  EXPECT_LT(out.find("batch_size:"), out.find("checkpointer:"));
  EXPECT_EQ(out.find("# Config"), std::string::npos);
  EXPECT_THROW(cmd_cat({"lora_finetune_single_device"}), ktune::Error);
  // An unknown name is named as given (no --config was), with a suggestion.
  try {
    cmd_cat({"llama3_2/1B_lora_single_devic"});
    FAIL();
  } catch (const ktune::Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("llama3_2/1B_lora_single_devic: neither a bundled config", 0), 0u) << e.what();
    EXPECT_NE(std::string(e.what()).find("llama3_2/1B_lora_single_device"), std::string::npos) << e.what();
  }
}

TEST(ConfigCli, ValidateSaysWellFormedOrListsEveryError) {
  std::string out = run_captured(cmd_validate, {"llama3_2/1B_lora_single_device"});
  EXPECT_EQ(out, "Config is well-formed!\n");
  out = run_captured(cmd_validate, {"llama3_2/1B_lora_single_device", "model.lora_rank=8", "dtype=fp32"});
  EXPECT_EQ(out, "Config is well-formed!\n");
  try {
    cmd_validate({"llama3_2/1B_lora_single_device", "dtype=fp16", "batch_size=0"});
    FAIL();
  } catch (const ktune::Errors& e) {
    EXPECT_EQ(e.errors().size(), 2u);
  }
  // A file: recipe from --recipe, or guessed from its builder.
  fs::path dir = scratch("validate");
  run_captured(cmd_cp, {"llama3_2/1B_full", (dir / "mine.yaml").string()});
  out = run_captured(cmd_validate, {(dir / "mine.yaml").string()});
  EXPECT_EQ(out, "Config is well-formed!\n");
  out = run_captured(cmd_validate, {"--recipe", "full_finetune_distributed", (dir / "mine.yaml").string()});
  EXPECT_EQ(out, "Config is well-formed!\n");
  out = run_captured(cmd_validate, {"--config=" + (dir / "mine.yaml").string()});  // as `ktune run --config=FILE`
  EXPECT_EQ(out, "Config is well-formed!\n");
  EXPECT_THROW(cmd_validate({"--recipe", "lora_finetune_single_device", (dir / "mine.yaml").string()}), ktune::Errors);
  // A file named as a bundled config plus ".yaml" is that file (torchtune: only exact names are
  // bundled), as after `ktune cp NAME NAME.yaml --make-parents` and an edit; with no such file the
  // name with ".yaml" is still the bundled config.
  run_captured(cmd_cp, {"--make-parents", "llama3_2/1B_full", (dir / "llama3_2/1B_full.yaml").string()});
  std::ifstream copied(dir / "llama3_2/1B_full.yaml");
  std::string text((std::istreambuf_iterator<char>(copied)), std::istreambuf_iterator<char>());
  const size_t batch = text.find("\nbatch_size: ");
  ASSERT_NE(batch, std::string::npos);
  text.replace(batch, text.find('\n', batch + 1) - batch, "\nbatch_size: 0");
  std::ofstream(dir / "llama3_2/1B_full.yaml") << text;
  const fs::path before = fs::current_path();
  fs::current_path(dir);
  EXPECT_THROW(cmd_validate({"llama3_2/1B_full.yaml"}), ktune::Errors);  // the edited copy, batch_size 0
  EXPECT_EQ(run_captured(cmd_validate, {"llama3_2/1B_full"}), "Config is well-formed!\n");  // the bundled one
  EXPECT_EQ(run_captured(cmd_validate, {"qwen2_5/0.5B_full.yaml"}), "Config is well-formed!\n");  // no such file: bundled
  fs::current_path(before);
  // One config: a second one (torchtune's validate takes one) is refused, naming both, never
  // silently validated in place of the first.
  try {
    cmd_validate({"llama3_2/1B_full", "--config", "llama3_2/1B_lora_single_device", "model.lora_rank=0"});
    FAIL();
  } catch (const ktune::Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "--config llama3_2/1B_lora_single_device: given twice (first: llama3_2/1B_full): validate takes one config");
  }
}
