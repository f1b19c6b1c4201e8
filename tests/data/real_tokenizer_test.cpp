// End to end with the real tokenizers (where ../shared/data/tokenizers is present, or
// KTUNE_TOKENIZERS points at a copy): ktune's own Llama 3 tiktoken and Qwen3 tokenizer.json
// loaders + chat formats + builders, against torchtune 0.6.1's Llama3Tokenizer and
// Qwen2_5Tokenizer over the same datasets (fixtures/real_tokenizer_cases.json, ids only).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include <unistd.h>

#include "core/error.h"
#include "data/dataset_builders.h"
#include "fixture_cases.h"
#include "text/hf_chat_template.h"

namespace ktune {
namespace {

namespace fs = std::filesystem;

std::string tokenizers_root() {
  if (const char* env = std::getenv("KTUNE_TOKENIZERS")) return env;
  return std::string(KTUNE_SOURCE_DIR) + "/../shared/data/tokenizers";
}

// The decompressed file (cached under the build tree), or "" when the .xz is not there. ctest
// runs this file's tests side by side: each unpacks into a temporary of its own process and
// renames it into place (atomic; the later rename replaces an identical file).
std::string unpacked(const std::string& relative) {
  const fs::path xz = fs::path(tokenizers_root()) / (relative + ".xz");
  if (!fs::exists(xz)) return "";
  const fs::path out = fs::path(KTUNE_BINARY_DIR) / "data_test_tokenizers" / relative;
  if (!fs::exists(out)) {
    fs::create_directories(out.parent_path());
    const std::string tmp = out.string() + "." + std::to_string(::getpid()) + ".part";
    const std::string cmd = "xz -dc '" + xz.string() + "' > '" + tmp + "'";
    if (std::system(cmd.c_str()) != 0) return "";
    fs::rename(tmp, out);
  }
  return out.string();
}

TEST(RealTokenizers, DatasetsMatchTorchtuneWithLlama3AndQwen3Tokenizers) {
  const std::string llama = unpacked("llama3/tokenizer.model"), qwen = unpacked("qwen3/tokenizer.json");
  if (llama.empty() || qwen.empty())
    GTEST_SKIP() << "real tokenizers not found under " << tokenizers_root() << " (set KTUNE_TOKENIZERS)";
  std::unique_ptr<Tokenizer> llama_tok = load_tokenizer({llama, "", ""});
  std::unique_ptr<Tokenizer> qwen_tok = load_tokenizer({qwen, "", ""});
  nlohmann::json cases = testing::load_json(testing::fixtures_dir() + "/real_tokenizer_cases.json");
  ASSERT_GE(cases.size(), 9u);
  for (const auto& c : cases) {
    const std::string name = c.at("name");
    SCOPED_TRACE(name);
    const std::string fmt = c.at("format");
    const Tokenizer& tok = fmt == "llama3" ? *llama_tok : *qwen_tok;
    EXPECT_EQ(detect_chat_format(tok), parse_chat_format(fmt));
    ChatFormat format(tok, parse_chat_format(fmt), c.at("max_seq_len").get<int64_t>());
    TokenizedDataset d = build_dataset(testing::options_from_case(c.at("component"), c.at("options")), format);
    const auto& samples = c.at("samples");
    ASSERT_EQ(d.size(), (int64_t)samples.size());
    for (int64_t i = 0; i < d.size(); ++i) {
      std::vector<int32_t> tokens(d.tokens(i).begin(), d.tokens(i).end());
      EXPECT_EQ(tokens, samples[i].at("tokens").get<std::vector<int32_t>>()) << "sample " << i;
      EXPECT_EQ(d.labels(i), samples[i].at("labels").get<std::vector<int32_t>>()) << "sample " << i;
    }
  }
}

// Tool calling through the real Qwen3 chat template and tokenizer (its template renders tools,
// tool_calls and tool results): the tool conversations of tests/text/fixtures/chat_template as an
// openai-style dataset, against transformers' apply_chat_template(messages, tools=...) run now by
// chat_template_reference.py, ids and masks. Qwen3's template needs an assistant's content to be
// text: a call with content null fails in transformers, and in ktune naming the row.
TEST(RealTokenizers, Qwen3ToolCallingDatasetMatchesTransformers) {
  const std::string qwen = unpacked("qwen3/tokenizer.json");
  const std::string config = tokenizers_root() + "/qwen3/tokenizer_config.json";
  if (qwen.empty() || !fs::exists(config))
    GTEST_SKIP() << "the real Qwen3 tokenizer is not under " << tokenizers_root() << " (set KTUNE_TOKENIZERS)";
  if (std::system("python3 -c 'import transformers' 2>/dev/null") != 0) GTEST_SKIP() << "transformers is not installed";
  const fs::path dir = fs::path(KTUNE_BINARY_DIR) / "data_test_tokenizers" / "qwen3_tool_calling";
  fs::create_directories(dir);
  fs::copy_file(qwen, dir / "tokenizer.json", fs::copy_options::overwrite_existing);
  fs::copy_file(config, dir / "tokenizer_config.json", fs::copy_options::overwrite_existing);
  const std::string fixtures = std::string(KTUNE_SOURCE_DIR) + "/tests/text/fixtures/chat_template";
  const nlohmann::ordered_json all = nlohmann::ordered_json::parse(std::ifstream(fixtures + "/tool_conversations.json"));
  nlohmann::ordered_json with_text = nlohmann::ordered_json::array(), null_content = nlohmann::ordered_json::array();
  for (const nlohmann::ordered_json& c : all) {
    bool has_null = false;
    for (const nlohmann::ordered_json& m : c["messages"]) has_null |= m.contains("content") && m["content"].is_null();
    (has_null ? null_content : with_text).push_back(c);
  }
  ASSERT_EQ(with_text.size(), 3u);
  ASSERT_EQ(null_content.size(), 1u);
  std::ofstream(dir / "conversations.json") << with_text.dump();
  const std::string out = (dir / "reference.json").string();
  const std::string cmd = "python3 '" + fixtures + "/chat_template_reference.py' '" + dir.string() + "' '" +
                          (dir / "conversations.json").string() + "' > '" + out + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;  // a broken reference is no reason to skip
  const nlohmann::json expected = testing::load_json(out);

  TokenizerOptions t;
  t.path = (dir / "tokenizer.json").string();
  t.config_path = (dir / "tokenizer_config.json").string();
  std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(t);
  std::optional<HfChatTemplate> chat = HfChatTemplate::from_tokenizer_config(t.config_path);
  ASSERT_TRUE(chat.has_value());
  const ChatFormat format(*tokenizer, *chat, chat->eos_id(*tokenizer));
  const std::string rows = (dir / "tools.jsonl").string();
  testing::write_tool_rows(with_text, rows, false);
  testing::expect_samples_equal_reference(build_dataset(testing::openai_chat_dataset(rows), format), expected);

  testing::write_tool_rows(null_content, rows, false);
  try {
    build_dataset(testing::openai_chat_dataset(rows), format);
    ADD_FAILURE() << "a call with content null went through Qwen3's template";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tools.jsonl: row 0 (line 1): the chat template failed"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ktune
