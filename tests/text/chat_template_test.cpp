// The chat-template format (ChatFormatKind::kTemplate, text/hf_chat_template.h) against transformers:
// fixtures/chat_template/expected.json holds, for six model folders and the conversations of
// conversations.json, the text apply_chat_template renders, its ids, and the masks
// chat_template_reference.py derives (regenerate with fixtures/chat_template/make_fixtures.py).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/chat_format.h"
#include "text/hf_chat_template.h"
#include "text/tokenizer.h"

namespace ktune {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string fixtures() { return std::string(KTUNE_SOURCE_DIR) + "/tests/text/fixtures"; }
std::string folder(const std::string& name) { return fixtures() + "/chat_template/" + name; }

json read_json(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

// The byte_level fixture tokenizer with a model folder's tokenizer_config.json.
std::unique_ptr<Tokenizer> tokenizer_with(const std::string& config_path) {
  TokenizerOptions o;
  o.path = fixtures() + "/byte_level/tokenizer.json";
  o.config_path = config_path;
  return load_tokenizer(o);
}

std::vector<Message> messages_of(const json& conversation) {
  std::vector<Message> messages;
  for (const json& m : conversation["messages"])
    messages.push_back(Message::text(m["role"], m["content"], m["masked"].get<bool>()));
  return messages;
}

ChatFormat template_format(const Tokenizer& tokenizer, const std::string& config, int64_t max_seq_len = 0,
                           Truncation truncation = Truncation::kRight) {
  std::optional<HfChatTemplate> chat = HfChatTemplate::from_tokenizer_config(config);
  EXPECT_TRUE(chat.has_value()) << config;
  const std::optional<int32_t> eos = chat->eos_id(tokenizer);
  return ChatFormat(tokenizer, std::move(*chat), eos, max_seq_len, truncation);
}

TEST(ChatTemplate, TextIdsAndMasksEqualTransformers) {
  const json conversations = read_json(folder("conversations.json"));
  const json expected = read_json(folder("expected.json"));
  ASSERT_EQ(expected.size(), 6u);
  for (const auto& [name, cases] : expected.items()) {
    const std::string config = folder(name) + "/tokenizer_config.json";
    auto tokenizer = tokenizer_with(config);
    const HfChatTemplate chat = *HfChatTemplate::from_tokenizer_config(config);
    const ChatFormat format = template_format(*tokenizer, config);
    ASSERT_EQ(cases.size(), conversations.size());
    for (size_t i = 0; i < cases.size(); ++i) {
      SCOPED_TRACE(name + "/" + cases[i]["name"].get<std::string>());
      const bool add_end_tokens = conversations[i]["add_end_tokens"];
      std::vector<Message> messages = messages_of(conversations[i]);
      TokenizedMessages out = format.tokenize(messages, add_end_tokens);
      EXPECT_EQ(out.tokens, cases[i]["tokens"].get<std::vector<int32_t>>());
      EXPECT_EQ(out.mask, cases[i]["mask"].get<std::vector<uint8_t>>());
      EXPECT_FALSE(out.truncated);
      if (!add_end_tokens && messages.back().role == "assistant") messages.pop_back();
      EXPECT_EQ(chat.render(messages, !add_end_tokens), cases[i]["text"].get<std::string>());
    }
  }
}

// torchtune's truncation: right keeps the first max_seq_len ids and ends them with the EOS (masked),
// left keeps the last max_seq_len.
TEST(ChatTemplate, TruncatesRightOrLeft) {
  const std::string config = folder("chatml_system") + "/tokenizer_config.json";
  auto tokenizer = tokenizer_with(config);
  const json conversation = read_json(folder("conversations.json"))[1];
  const json whole = read_json(folder("expected.json"))["chatml_system"][1];
  const auto tokens = whole["tokens"].get<std::vector<int32_t>>();
  const auto mask = whole["mask"].get<std::vector<uint8_t>>();
  const int64_t n = 40;
  ASSERT_GT((int64_t)tokens.size(), n);

  TokenizedMessages right = template_format(*tokenizer, config, n).tokenize(messages_of(conversation));
  EXPECT_TRUE(right.truncated);
  std::vector<int32_t> want(tokens.begin(), tokens.begin() + n);
  want.back() = *tokenizer->token_to_id("<|end_of_text|>");
  EXPECT_EQ(right.tokens, want);
  std::vector<uint8_t> want_mask(mask.begin(), mask.begin() + n);
  want_mask.back() = 1;
  EXPECT_EQ(right.mask, want_mask);

  TokenizedMessages left = template_format(*tokenizer, config, n, Truncation::kLeft).tokenize(messages_of(conversation));
  EXPECT_TRUE(left.truncated);
  EXPECT_EQ(left.tokens, std::vector<int32_t>(tokens.end() - n, tokens.end()));
  EXPECT_EQ(left.mask, std::vector<uint8_t>(mask.end() - n, mask.end()));
}

TEST(ChatTemplate, NoTemplateIsNone) {
  const fs::path dir = fs::temp_directory_path() / ("ktune_chat_template_none_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "tokenizer_config.json") << R"({"eos_token": "<|eot_id|>", "chat_template": null})";
  EXPECT_FALSE(HfChatTemplate::from_tokenizer_config((dir / "tokenizer_config.json").string()).has_value());
  fs::remove_all(dir);
}

// A config at fault is named, with what is wrong in it.
TEST(ChatTemplate, BadConfigsNameTheFile) {
  const fs::path dir = fs::temp_directory_path() / ("ktune_chat_template_bad_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "tokenizer_config.json").string();
  auto error_of = [&](const std::string& text) -> std::string {
    std::ofstream(path) << text;
    try {
      HfChatTemplate::from_tokenizer_config(path);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  std::string e = error_of(R"({"chat_template": 3})");
  EXPECT_NE(e.find(path + ": chat_template"), std::string::npos) << e;
  EXPECT_NE(e.find("must be a string or a list"), std::string::npos) << e;
  e = error_of(R"({"chat_template": [{"name": "tool_use", "template": "x"}, {"name": "rag", "template": "y"}]})");
  EXPECT_NE(e.find("tool_use, rag"), std::string::npos) << e;
  EXPECT_NE(e.find("\"default\""), std::string::npos) << e;
  e = error_of(R"({"chat_template": "{% for m in messages %}{{ m.content }}"})");  // no endfor
  EXPECT_NE(e.find(path + ": chat_template"), std::string::npos) << e;
  e = error_of(R"({"chat_template": "{{ x }")");
  EXPECT_NE(e.find("not valid JSON"), std::string::npos) << e;
  fs::remove_all(dir);
}

// The template's raise_exception reaches the caller with its message (Mistral's alternation rule).
TEST(ChatTemplate, RaiseExceptionIsAnError) {
  const fs::path dir = fs::temp_directory_path() / ("ktune_chat_template_raise_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "tokenizer_config.json")
      << R"({"chat_template": "{% for m in messages %}{% if (m.role == 'user') != (loop.index0 % 2 == 0) %})"
         R"({{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %})"
         R"({{ m.content }}{% endfor %}"})";
  const HfChatTemplate chat = *HfChatTemplate::from_tokenizer_config((dir / "tokenizer_config.json").string());
  EXPECT_EQ(chat.render({Message::text("user", "a"), Message::text("assistant", "b")}, false), "ab");
  try {
    chat.render({Message::text("assistant", "b")}, false);
    ADD_FAILURE() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("Conversation roles must alternate"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

// Without an eos_token in tokenizer_config.json, generation_config.json's first eos_token_id.
TEST(ChatTemplate, EosFromGenerationConfig) {
  const fs::path dir = fs::temp_directory_path() / ("ktune_chat_template_eos_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "tokenizer_config.json") << R"({"chat_template": "{{ messages[0].content }}"})";
  std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": [2, 1]})";
  std::ofstream(dir / "bad_generation_config.json") << R"({"eos_token_id": "x"})";
  const std::string config = (dir / "tokenizer_config.json").string();
  auto tokenizer = tokenizer_with(config);
  const HfChatTemplate chat = *HfChatTemplate::from_tokenizer_config(config);
  EXPECT_EQ(chat.eos_id(*tokenizer, (dir / "generation_config.json").string()), 2);
  const std::string llama_config = folder("llama_style") + "/tokenizer_config.json";  // names <|eot_id|>
  auto llama_tokenizer = tokenizer_with(llama_config);
  EXPECT_EQ(HfChatTemplate::from_tokenizer_config(llama_config)->eos_id(*llama_tokenizer, (dir / "generation_config.json").string()),
            tokenizer->token_to_id("<|eot_id|>"));
  try {
    chat.eos_id(*tokenizer, (dir / "bad_generation_config.json").string());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad_generation_config.json: eos_token_id"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ktune
