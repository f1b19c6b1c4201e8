// Reading the reference cases make_data_fixtures.py wrote (torchtune's output) into the C++ types
// the data layer takes: fixture paths, the byte tokenizer a case's chat format was made with, and
// a case's torchtune builder kwargs as DatasetOptions; the tool-calling conversations as a dataset.
#pragma once

#include <fstream>
#include <memory>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "byte_tokenizer.h"
#include "data/dataset_builders.h"

namespace ktune::testing {

inline std::string fixtures_dir() { return std::string(KTUNE_SOURCE_DIR) + "/tests/data/fixtures"; }
inline std::string files_dir() { return fixtures_dir() + "/files"; }
inline std::string bad_dir() { return fixtures_dir() + "/bad"; }

inline nlohmann::json load_json(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error("missing fixture " + path + " (run tests/data/fixtures/make_data_fixtures.py)");
  return nlohmann::json::parse(f);
}

inline std::unique_ptr<ByteTokenizer> tokenizer_for(const std::string& format) {
  using F = ByteTokenizer::Flavour;
  if (format == "llama3") return std::make_unique<ByteTokenizer>(F::kLlama3);
  if (format == "chatml") return std::make_unique<ByteTokenizer>(F::kQwen);
  if (format == "gemma") return std::make_unique<ByteTokenizer>(F::kGemma);
  return std::make_unique<ByteTokenizer>(F::kSentencePiece);  // mistral, plain
}

// torchtune builder kwargs (paths relative to files/) → DatasetOptions.
inline DatasetOptions options_from_case(const std::string& component, const nlohmann::json& kw) {
  DatasetOptions o;
  o.component = component;
  std::string source = kw.at("source");
  static const char* kFormats[] = {"json", "csv", "parquet", "arrow", "text"};
  bool is_format = false;
  for (const char* f : kFormats) is_format |= source == f;
  o.source = is_format ? source : files_dir() + "/" + source;
  if (kw.contains("data_dir")) o.data_dir = files_dir() + "/" + kw["data_dir"].get<std::string>();
  if (kw.contains("data_files")) {
    std::string f = kw["data_files"];
    o.data_files = {kw.contains("data_dir") ? f : files_dir() + "/" + f};
  }
  if (kw.contains("split")) o.split = kw["split"];
  if (kw.contains("column_map")) o.column_map = kw["column_map"].get<std::map<std::string, std::string>>();
  if (kw.contains("train_on_input")) o.train_on_input = kw["train_on_input"].get<bool>();
  if (kw.contains("new_system_prompt")) o.new_system_prompt = kw["new_system_prompt"].get<std::string>();
  if (kw.contains("conversation_column")) o.conversation_column = kw["conversation_column"];
  if (kw.contains("conversation_style")) o.conversation_style = kw["conversation_style"];
  if (kw.contains("add_eos")) o.add_eos = kw["add_eos"];
  return o;
}

// The conversations of tests/text/fixtures/chat_template/tool_conversations.json as an openai-style
// JSONL dataset: a row a conversation, {"messages": [its messages less the fixtures' "masked"],
// "tools": its tools (as a list, or as JSON text)}; keys in the fixture's order.
inline void write_tool_rows(const nlohmann::ordered_json& conversations, const std::string& path, bool tools_as_text) {
  std::ofstream rows(path);
  for (const nlohmann::ordered_json& c : conversations) {
    nlohmann::ordered_json row;
    row["messages"] = nlohmann::ordered_json::array();
    for (nlohmann::ordered_json m : c["messages"]) {
      m.erase("masked");
      row["messages"].push_back(m);
    }
    row["tools"] = tools_as_text ? nlohmann::ordered_json(c["tools"].dump()) : c["tools"];
    rows << row.dump() << "\n";
  }
}

// The options of a chat_dataset over such a file.
inline DatasetOptions openai_chat_dataset(const std::string& path) {
  DatasetOptions o;
  o.component = "torchtune.datasets.chat_dataset";
  o.source = "json";
  o.data_files = {path};
  o.conversation_column = "messages";
  o.conversation_style = "openai";
  return o;
}

// Each sample's tokens and mask (1 = not trained) equal chat_template_reference.py's.
inline void expect_samples_equal_reference(const TokenizedDataset& data, const nlohmann::json& expected) {
  ASSERT_EQ(data.size(), (int64_t)expected.size());
  for (int64_t i = 0; i < data.size(); ++i) {
    SCOPED_TRACE(expected[(size_t)i]["name"].get<std::string>());
    const std::span<const int32_t> tokens = data.tokens(i);
    EXPECT_EQ(std::vector<int32_t>(tokens.begin(), tokens.end()), expected[(size_t)i]["tokens"].get<std::vector<int32_t>>());
    std::vector<uint8_t> mask;
    for (uint8_t trained : data.trained(i)) mask.push_back(trained ? 0 : 1);
    EXPECT_EQ(mask, expected[(size_t)i]["mask"].get<std::vector<uint8_t>>());
  }
}

}  // namespace ktune::testing
