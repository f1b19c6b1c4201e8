// Dataset builders against torchtune 0.6.1 + HF datasets reading the same files with the same
// splits (fixtures/dataset_cases.json): identical tokens and labels, sample by sample. Then the
// bad-input errors and the truncation count.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "data/dataset_builders.h"
#include "text/hf_chat_template.h"
#include "fixture_cases.h"

namespace ktune {
namespace {

using testing::bad_dir;
using testing::files_dir;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

void expect_contains(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "'" << part << "' not in: " << text;
}

TEST(DatasetBuilders, MatchTorchtuneOnEveryFixtureDataset) {
  nlohmann::json cases = testing::load_json(testing::fixtures_dir() + "/dataset_cases.json");
  ASSERT_GE(cases.size(), 18u);
  for (const auto& c : cases) {
    const std::string name = c.at("name");
    SCOPED_TRACE(name);
    auto tok = testing::tokenizer_for(c.at("format"));
    ChatFormat format(*tok, parse_chat_format(c.at("format").get<std::string>()), c.at("max_seq_len").get<int64_t>());
    DatasetOptions o = testing::options_from_case(c.at("component"), c.at("options"));
    TokenizedDataset d = build_dataset(o, format);
    const auto& samples = c.at("samples");
    ASSERT_EQ(d.size(), (int64_t)samples.size());
    for (int64_t i = 0; i < d.size(); ++i) {
      std::vector<int32_t> tokens(d.tokens(i).begin(), d.tokens(i).end());
      ASSERT_EQ(tokens, samples[i].at("tokens").get<std::vector<int32_t>>()) << "sample " << i;
      ASSERT_EQ(d.labels(i), samples[i].at("labels").get<std::vector<int32_t>>()) << "sample " << i;
    }
  }
}

TEST(DatasetBuilders, CountsTruncatedSamples) {
  testing::ByteTokenizer tok(testing::ByteTokenizer::Flavour::kLlama3);
  ChatFormat format(tok, ChatFormatKind::kLlama3, 64);
  DatasetOptions o;
  o.source = "json";
  o.data_files = {bad_dir() + "/too_long.jsonl"};
  TokenizedDataset d = build_dataset(o, format);
  ASSERT_EQ(d.size(), 3);
  EXPECT_EQ(d.num_truncated, 1);
  EXPECT_EQ(d.length(1), 64);
  EXPECT_EQ(d.tokens(1).back(), *tok.token_to_id("<|end_of_text|>"));
  EXPECT_LT(d.length(0), 64);
}

TEST(DatasetBuilders, MemoryIsTheTokensPlusOffsets) {
  testing::ByteTokenizer tok(testing::ByteTokenizer::Flavour::kQwen);
  ChatFormat format(tok, ChatFormatKind::kChatML);
  DatasetOptions o;
  o.source = "parquet";
  o.data_dir = files_dir() + "/hf_repo/data";
  TokenizedDataset d = build_dataset(o, format);
  EXPECT_EQ(d.size(), 24);
  // 4 bytes an id + 1 a mask byte + 8 an offset: nothing per sample beyond that.
  EXPECT_EQ(d.memory_bytes(), (size_t)d.num_tokens() * 5 + (size_t)(d.size() + 1) * 8);
}

struct BadCase {
  DatasetOptions options;
  ChatFormatKind kind = ChatFormatKind::kLlama3;
};

std::string build_error(DatasetOptions o, ChatFormatKind kind = ChatFormatKind::kLlama3) {
  auto tok = testing::tokenizer_for(kind == ChatFormatKind::kChatML ? "chatml" : kind == ChatFormatKind::kMistral ? "mistral" : "llama3");
  ChatFormat format(*tok, kind);
  return error_of([&] { build_dataset(o, format); });
}

TEST(DatasetBuilderErrors, MissingColumnIsNamedWithTheColumnsThatExist) {
  DatasetOptions o;
  o.source = "json";
  o.data_files = {files_dir() + "/qa.jsonl"};
  o.column_map = {{"input", "prompt"}, {"output", "answer"}};
  std::string e = build_error(o);
  expect_contains(e, "qa.jsonl: row 0");
  expect_contains(e, "column 'prompt'");
  expect_contains(e, "question, answer, id");
  o.column_map = {{"input", "question"}};
  e = build_error(o);
  expect_contains(e, "dataset.column_map");
  expect_contains(e, "'output'");
}

TEST(DatasetBuilderErrors, UnknownConversationStyleAndRole) {
  DatasetOptions o;
  o.component = "torchtune.datasets.chat_dataset";
  o.source = "json";
  o.data_files = {files_dir() + "/sharegpt.jsonl"};
  o.conversation_column = "conversations";
  o.conversation_style = "alpaca";
  std::string e = build_error(o);
  expect_contains(e, "dataset.conversation_style");
  expect_contains(e, "'alpaca'");
  expect_contains(e, "sharegpt or openai");
  o.conversation_style = "sharegpt";
  o.data_files = {bad_dir() + "/sharegpt_bad_role.jsonl"};
  e = build_error(o);
  expect_contains(e, "sharegpt_bad_role.jsonl: row 0");
  expect_contains(e, "message 1");
  expect_contains(e, "'robot'");
  o.conversation_column = "";
  expect_contains(build_error(o), "dataset.conversation_column");
}

// A conversation the model's chat template refuses (raise_exception: Gemma's "System role not
// supported") stops the build naming the row, the template and its message.
TEST(DatasetBuilderErrors, AChatTemplateThatRefusesAConversationNamesTheRow) {
  const std::string dir = ::testing::TempDir() + "ktune_template_rows_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/chat.jsonl")
      << R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]})" "\n"
      << R"({"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},)"
         R"( {"role": "assistant", "content": "hello"}]})" "\n";
  auto tok = testing::tokenizer_for("llama3");
  const HfChatTemplate chat(
      "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
      "{{ m.role + ': ' + m.content + '\\n' }}{% endfor %}",
      "test template", nlohmann::ordered_json::object());
  const ChatFormat format(*tok, chat, tok->eos_id());
  DatasetOptions o;
  o.component = "torchtune.datasets.chat_dataset";
  o.source = "json";
  o.data_files = {dir + "/chat.jsonl"};
  o.conversation_column = "messages";
  o.conversation_style = "openai";
  const std::string e = error_of([&] { build_dataset(o, format); });
  expect_contains(e, "chat.jsonl: row 1 (line 2)");
  expect_contains(e, "the chat template failed on this conversation");
  expect_contains(e, "test template");
  expect_contains(e, "System role not supported");
  std::filesystem::remove_all(dir);
}

// Tool calling through a model's own chat template: openai-style rows whose assistants call tools
// (tool_calls, content null or text, arguments a dict or JSON text), tool results (role "tool") and
// a "tools" column (a list, or the same list as JSON text, as Parquet datasets store it). The
// samples equal transformers' apply_chat_template(messages, tools=...) with the masks of
// chat_template_reference.py (tests/text/fixtures/chat_template/expected_tools.json); the keys of a
// call's arguments keep their order (the data layer's rows are ordered).
TEST(DatasetBuilders, ToolCallingConversationsEqualTransformers) {
  const std::string text_fixtures = std::string(KTUNE_SOURCE_DIR) + "/tests/text/fixtures";
  const std::string folder = text_fixtures + "/chat_template";
  const nlohmann::ordered_json conversations =
      nlohmann::ordered_json::parse(std::ifstream(folder + "/tool_conversations.json"));
  const nlohmann::json expected = testing::load_json(folder + "/expected_tools.json")["tool_calling"];
  ASSERT_EQ(expected.size(), conversations.size());
  const std::string dir = ::testing::TempDir() + "ktune_tool_rows_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  TokenizerOptions t;
  t.path = text_fixtures + "/byte_level/tokenizer.json";
  t.config_path = folder + "/tool_calling/tokenizer_config.json";
  auto tokenizer = load_tokenizer(t);
  std::optional<HfChatTemplate> chat = HfChatTemplate::from_tokenizer_config(t.config_path);
  ASSERT_TRUE(chat.has_value());
  const ChatFormat format(*tokenizer, *chat, chat->eos_id(*tokenizer));
  for (const bool tools_as_text : {false, true}) {
    SCOPED_TRACE(tools_as_text ? "tools as JSON text" : "tools as a list");
    testing::write_tool_rows(conversations, dir + "/tools.jsonl", tools_as_text);
    testing::expect_samples_equal_reference(build_dataset(testing::openai_chat_dataset(dir + "/tools.jsonl"), format), expected);
  }
  std::filesystem::remove_all(dir);
}

// Tool calls and tools are refused, naming the row, where they cannot be rendered (a family
// format: torchtune's tokenizers have no place for them) or are malformed.
TEST(DatasetBuilderErrors, ToolCallsNeedAChatTemplateAndWellFormedTools) {
  const std::string dir = ::testing::TempDir() + "ktune_tool_errors_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string user = R"({"role": "user", "content": "2 + 3?"})";
  const std::string call = R"({"role": "assistant", "content": null, "tool_calls": [{"name": "add", "arguments": {"a": 2}}]})";
  const std::string result = R"({"role": "tool", "content": "5"}, {"role": "assistant", "content": "5"})";
  auto build = [&](const std::string& rows, const ChatFormat& format) {
    std::ofstream(dir + "/rows.jsonl") << rows;
    return error_of([&] { build_dataset(testing::openai_chat_dataset(dir + "/rows.jsonl"), format); });
  };
  auto llama3 = testing::tokenizer_for("llama3");
  const ChatFormat family(*llama3, ChatFormatKind::kLlama3);
  const std::string plain_row = R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]})" "\n";
  std::string e = build(plain_row + R"({"messages": [)" + user + ", " + call + ", " + result + "]}\n", family);
  expect_contains(e, "rows.jsonl: row 1 (line 2)");
  expect_contains(e, "the llama3 chat format refused this conversation");
  expect_contains(e, "message 1");
  expect_contains(e, "tool_calls need the model's own chat template");
  e = build(plain_row + R"({"tools": [{"name": "add"}], "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]})" "\n", family);
  expect_contains(e, "rows.jsonl: row 1 (line 2)");
  expect_contains(e, "tools need the model's own chat template");
  // A tool's result then an answer is a conversation (torchtune's validate_messages refuses it).
  EXPECT_EQ(build(R"({"messages": [)" + user + R"(, {"role": "assistant", "content": "calling"}, )" + result + "]}\n", family),
            "(no error)");

  const HfChatTemplate chat("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}{{ tools | tojson }}",
                            "test template", nlohmann::ordered_json::object());
  const ChatFormat templated(*llama3, chat, llama3->eos_id());
  e = build(R"({"tools": "[{\"name\": ", "messages": [)" + user + ", " + call + ", " + result + "]}\n", templated);
  expect_contains(e, "rows.jsonl: row 0 (line 1)");
  expect_contains(e, "column 'tools' holds text that is not JSON");
  e = build(R"({"tools": {"name": "add"}, "messages": [)" + user + ", " + call + ", " + result + "]}\n", templated);
  expect_contains(e, "column 'tools' holds object, expected a list of tool schemas");
  e = build(R"({"messages": [{"role": "user", "content": "x", "tool_calls": [{"name": "add"}]}, {"role": "assistant", "content": "5"}]})" "\n", templated);
  expect_contains(e, "message 0");
  expect_contains(e, "only an assistant calls tools");
  e = build(R"({"messages": [)" + user + R"(, {"role": "assistant"}]})" "\n", templated);
  expect_contains(e, "needs 'role' and 'content' keys");
  EXPECT_EQ(build(R"({"tools": "", "messages": [)" + user + ", " + call + ", " + result + "]}\n", templated), "(no error)");
  std::filesystem::remove_all(dir);
}

// A blank line of a text corpus is a row of empty text, which Llama 3's tokenizer encodes as no
// token at all: kept as torchtune keeps it, counted, and its row named (the recipes leave such
// samples out, saying so).
TEST(DatasetBuilders, RowsOfNoTokensAreCountedNamingTheFirst) {
  const std::string dir = ::testing::TempDir() + "ktune_empty_rows_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/corpus.txt") << "hello\n\nworld\n";
  testing::ByteTokenizer tok(testing::ByteTokenizer::Flavour::kLlama3);
  ChatFormat format(tok, ChatFormatKind::kLlama3, 64);
  DatasetOptions o;
  o.component = "torchtune.datasets.text_completion_dataset";
  o.source = "text";
  o.data_files = {dir + "/corpus.txt"};
  TokenizedDataset d = build_dataset(o, format);
  ASSERT_EQ(d.size(), 3);
  EXPECT_EQ(d.length(1), 0);
  EXPECT_EQ(d.num_empty, 1);
  EXPECT_EQ(d.first_empty, dir + "/corpus.txt: row 1 (line 2)");
  std::filesystem::remove_all(dir);
}

TEST(DatasetBuilderErrors, EmptyDatasetEmptySplitAndBadSplit) {
  DatasetOptions o;
  o.source = "json";
  o.data_files = {bad_dir() + "/empty.jsonl"};
  expect_contains(build_error(o), "selects no rows");
  expect_contains(build_error(o), "given by data_files (" + bad_dir() + "/empty.jsonl)");  // which file was empty
  o.data_files = {files_dir() + "/qa.jsonl"};
  o.column_map = {{"input", "question"}, {"output", "answer"}};
  o.split = "train[13:]";
  expect_contains(build_error(o), "selects no rows");
  o.split = "train[:0%]";
  expect_contains(build_error(o), "selects no rows");
  o.split = "train[a:b]";
  expect_contains(build_error(o), "dataset.split");
  o.split = "validation";
  expect_contains(build_error(o), "split 'validation' not found");
}

TEST(DatasetBuilderErrors, MalformedAndInvalidUtf8RowsSurfaceWithTheirPlace) {
  DatasetOptions o;
  o.source = "json";
  o.data_files = {bad_dir() + "/malformed.jsonl"};
  expect_contains(build_error(o), "malformed.jsonl:3");
  o.data_files = {bad_dir() + "/invalid_utf8.jsonl"};
  expect_contains(build_error(o), "invalid_utf8.jsonl:2");
  o.source = "csv";
  o.data_files = {bad_dir() + "/invalid_utf8.csv"};
  expect_contains(build_error(o), "invalid_utf8.csv: row 2 (line 5)");
}

TEST(DatasetBuilderErrors, UnknownBuilderAndMistralSystemPrompt) {
  DatasetOptions o;
  o.component = "torchtune.datasets.slimorca_dataset";
  expect_contains(build_error(o), "unknown dataset builder");
  DatasetOptions m;
  m.source = "json";
  m.data_files = {files_dir() + "/qa.jsonl"};
  m.column_map = {{"input", "question"}, {"output", "answer"}};
  m.new_system_prompt = "sys";
  expect_contains(build_error(m, ChatFormatKind::kMistral), "dataset.new_system_prompt");
}

}  // namespace
}  // namespace ktune
