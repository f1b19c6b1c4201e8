// check_copied_files: the JSON files a save copies into every checkpoint are refused before training
// when transformers could not read them, naming the file and key; good ones pass.
#include "train/copied_files_check.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"

namespace fs = std::filesystem;

namespace {

class CopiedFilesCheck : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ktune-copied-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    write("tokenizer.json", R"({"model":{"type":"BPE","vocab":{"a":0,"b":1}},
                                "added_tokens":[{"id":2,"content":"<|eot|>","special":true}]})");
    write("config.json", R"({"model_type":"llama"})");
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name, std::ios::binary) << text;
  }
  // The message of check_copied_files over the folder's files ("" when it passes).
  std::string verdict() {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(dir_)) files.push_back(e.path().filename());
    try {
      ktune::train::check_copied_files(dir_, files);
      return "";
    } catch (const ktune::Error& e) {
      return e.what();
    }
  }
  fs::path dir_;
};

TEST_F(CopiedFilesCheck, GoodFilesPass) {
  write("tokenizer_config.json", R"({"bos_token":"a","eos_token":{"content":"<|eot|>"},"pad_token":null,
                                     "chat_template":"{{ messages }}"})");
  write("generation_config.json", R"({"eos_token_id":[1,2]})");
  EXPECT_EQ(verdict(), "");
  write("tokenizer_config.json", R"({"chat_template":[{"name":"default","template":"{{ x }}"}]})");
  EXPECT_EQ(verdict(), "");
}

TEST_F(CopiedFilesCheck, AnUnreadableJsonFileIsNamed) {
  write("tokenizer_config.json", R"({"bos_token": )");
  const std::string message = verdict();
  EXPECT_NE(message.find((dir_ / "tokenizer_config.json").string() + ": not valid JSON"), std::string::npos) << message;
  EXPECT_NE(message.find("a save copies it into every checkpoint"), std::string::npos) << message;
  write("tokenizer_config.json", "{}");
  write("generation_config.json", "[1, 2");
  EXPECT_NE(verdict().find("generation_config.json: not valid JSON"), std::string::npos);
}

TEST_F(CopiedFilesCheck, SpecialTokensMustBeTokensOfTheTokenizerBesideThem) {
  write("tokenizer_config.json", R"({"eos_token":"<|nope|>"})");
  EXPECT_NE(verdict().find("tokenizer_config.json: eos_token: token '<|nope|>' is in neither the vocabulary nor the "
                           "added tokens"),
            std::string::npos)
      << verdict();
  write("tokenizer_config.json", R"({"bos_token":7})");
  EXPECT_NE(verdict().find("bos_token: expected a token (a string or {\"content\": string}), got 7"), std::string::npos)
      << verdict();
  // Without a tokenizer.json beside it, only the shape is checked.
  fs::remove(dir_ / "tokenizer.json");
  write("tokenizer_config.json", R"({"eos_token":"<|nope|>"})");
  EXPECT_EQ(verdict(), "");
}

TEST_F(CopiedFilesCheck, AChatTemplateMustBeAStringOrNamedTemplates) {
  write("tokenizer_config.json", R"({"chat_template":{"default":"{{ x }}"}})");
  EXPECT_NE(verdict().find("tokenizer_config.json: chat_template: expected a Jinja template (a string) or a list of "
                           "{\"name\", \"template\"} strings, got object"),
            std::string::npos)
      << verdict();
  write("tokenizer_config.json", R"({"chat_template":[{"name":"default"}]})");
  EXPECT_NE(verdict().find("chat_template"), std::string::npos);
}

}  // namespace
