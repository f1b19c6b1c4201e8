// The same proof as tokenizer_test.cpp on the real tokenizers — Llama 3 (tokenizer.json and the
// tiktoken tokenizer.model) and Qwen3 (tokenizer.json, and its vocabulary as vocab.json + merges.txt)
// — against HF `tokenizers` and `tiktoken`, run at test time by fixtures/reference_ids.py (the
// licensed files and their ids are never committed). Skips, saying why, where the files (default
// ../shared/data/tokenizers, or $KTUNE_TOKENIZER_DATA), xz, python3 or the packages are missing.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "text/chat_format.h"
#include "text/hf_chat_template.h"
#include "text/tokenizer.h"

namespace ktune {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string data_dir() {
  if (const char* env = std::getenv("KTUNE_TOKENIZER_DATA")) return env;
  return std::string(KTUNE_SOURCE_DIR) + "/../shared/data/tokenizers";
}
// A folder of the running test's own: ctest runs these tests side by side, and each writes its
// texts, references and unpacked files here.
std::string scratch() {
  std::string dir = std::string(KTUNE_BINARY_DIR) + "/test_scratch/text/real/" +
                    ::testing::UnitTest::GetInstance()->current_test_info()->name();
  fs::create_directories(dir);
  return dir;
}
std::string script() { return std::string(KTUNE_SOURCE_DIR) + "/tests/text/fixtures/reference_ids.py"; }

// Decompresses data_dir()/rel(.xz) into the scratch folder; "" with *why set when impossible.
std::string real_file(const std::string& rel, std::string* why) {
  std::string plain = data_dir() + "/" + rel;
  if (fs::exists(plain)) return plain;
  std::string xz = plain + ".xz";
  if (!fs::exists(xz)) {
    *why = "real tokenizer file not present: " + xz;
    return "";
  }
  std::string out = scratch() + "/" + rel;
  fs::create_directories(fs::path(out).parent_path());
  if (fs::exists(out) && fs::last_write_time(out) >= fs::last_write_time(xz)) return out;
  std::string cmd = "xz -dc '" + xz + "' > '" + out + ".tmp' && mv '" + out + ".tmp' '" + out + "'";
  if (std::system(cmd.c_str()) != 0) {
    *why = "cannot decompress " + xz + " (is xz installed?)";
    return "";
  }
  return out;
}

// The texts: the fixtures' multilingual sample plus longer mixed documents.
const std::vector<std::string>& texts() {
  static const std::vector<std::string> all = [] {
    std::ifstream in(std::string(KTUNE_SOURCE_DIR) + "/tests/text/fixtures/reference.json");
    json ref = json::parse(in);
    std::vector<std::string> t = ref["texts"].get<std::vector<std::string>>();
    std::mt19937 rng(7);
    std::vector<std::string> base = t;
    for (int doc = 0; doc < 40; ++doc) {
      std::string s;
      int n = 5 + int(rng() % 40);
      for (int k = 0; k < n; ++k) s += base[rng() % base.size()] + (rng() % 3 ? " " : "\n");
      t.push_back(s);
    }
    return t;
  }();
  return all;
}

// Runs reference_ids.py; "" with *why set when the reference cannot be produced here.
json run_reference(const std::string& kind, const std::string& file, std::string* why) {
  std::string texts_path = scratch() + "/texts.json";
  std::ofstream(texts_path) << json(texts()).dump();
  std::string out = scratch() + "/ref_" + kind + "_" + fs::path(file).parent_path().filename().string() + ".json";
  std::string cmd = "python3 '" + script() + "' " + kind + " '" + file + "' '" + texts_path + "' '" + out + "'";
  int rc = std::system(cmd.c_str());
  if (rc != 0) {
    *why = (WIFEXITED(rc) && WEXITSTATUS(rc) == 3) ? "a Python reference package is missing (tokenizers / tiktoken)"
                                                    : "reference script failed: " + cmd;
    if (!(WIFEXITED(rc) && WEXITSTATUS(rc) == 3)) ADD_FAILURE() << *why;  // a broken reference is no reason to skip
    return json();
  }
  return json::parse(std::ifstream(out));
}

void expect_same_ids(const Tokenizer& tok, const json& ref, bool add_bos, const std::string& label) {
  ASSERT_EQ(ref["ids"].size(), texts().size());
  int mismatches = 0;
  for (size_t i = 0; i < texts().size(); ++i) {
    std::vector<int32_t> want = ref["ids"][i].get<std::vector<int32_t>>();
    std::vector<int32_t> got = tok.encode(texts()[i]);
    if (got != want && ++mismatches <= 3)
      ADD_FAILURE() << label << " text #" << i << " " << json(texts()[i]).dump().substr(0, 300) << "\n want "
                    << json(want).dump().substr(0, 300) << "\n got  " << json(got).dump().substr(0, 300);
    if (add_bos) {
      EXPECT_EQ(tok.encode(texts()[i], true), ref["ids_special"][i].get<std::vector<int32_t>>()) << label << " #" << i;
    }
    EXPECT_EQ(tok.decode(want), ref["decoded"][i].get<std::string>()) << label << " decode #" << i;
    EXPECT_EQ(tok.encode_ordinary(texts()[i]), ref["ids_ordinary"][i].get<std::vector<int32_t>>()) << label << " ordinary #" << i;
  }
  EXPECT_EQ(mismatches, 0) << label;
}

TEST(RealTokenizers, Llama3TokenizerJsonMatchesHfTokenizers) {
  std::string why;
  std::string path = real_file("llama3/tokenizer.json", &why);
  if (path.empty()) GTEST_SKIP() << why;
  json ref = run_reference("hf", path, &why);
  if (ref.is_null()) GTEST_SKIP() << why;
  TokenizerOptions o;
  o.path = path;
  auto tok = load_tokenizer(o);
  EXPECT_EQ(tok->vocab_size(), 128256);
  EXPECT_EQ(tok->bos_id(), 128000);
  EXPECT_EQ(tok->eos_id(), 128001);
  EXPECT_EQ(tok->token_to_id("<|eot_id|>"), 128009);
  expect_same_ids(*tok, ref, true, "llama3 tokenizer.json");
}

TEST(RealTokenizers, Llama3TiktokenModelMatchesTiktoken) {
  std::string why;
  std::string path = real_file("llama3/tokenizer.model", &why);
  if (path.empty()) GTEST_SKIP() << why;
  json ref = run_reference("tiktoken", path, &why);
  if (ref.is_null()) GTEST_SKIP() << why;
  TokenizerOptions o;
  o.path = path;
  auto tok = load_tokenizer(o);
  EXPECT_EQ(tok->vocab_size(), 128256);
  EXPECT_EQ(tok->bos_id(), 128000);
  EXPECT_EQ(tok->eos_id(), 128001);
  EXPECT_EQ(tok->pad_id(), 128004);
  EXPECT_EQ(tok->token_to_id("<|start_header_id|>"), 128006);
  EXPECT_EQ(tok->token_to_id("<|end_header_id|>"), 128007);
  EXPECT_EQ(tok->token_to_id("<|eot_id|>"), 128009);
  EXPECT_EQ(tok->token_to_id("<|python_tag|>"), 128010);
  EXPECT_EQ(tok->token_to_id("<|reserved_special_token_246|>"), 128255);
  expect_same_ids(*tok, ref, true, "llama3 tokenizer.model");
}

TEST(RealTokenizers, Qwen3TokenizerJsonMatchesHfTokenizers) {
  std::string why;
  std::string path = real_file("qwen3/tokenizer.json", &why);
  if (path.empty()) GTEST_SKIP() << why;
  json ref = run_reference("hf", path, &why);
  if (ref.is_null()) GTEST_SKIP() << why;
  TokenizerOptions o;
  o.path = path;
  auto tok = load_tokenizer(o);
  EXPECT_EQ(tok->token_to_id("<|im_start|>"), 151644);
  EXPECT_EQ(tok->eos_id(), 151643);
  EXPECT_FALSE(tok->bos_id().has_value());
  expect_same_ids(*tok, ref, false, "qwen3 tokenizer.json");
  // With tokenizer_config.json: EOS is <|im_end|>, PAD <|endoftext|>.
  o.config_path = data_dir() + "/qwen3/tokenizer_config.json";
  if (fs::exists(o.config_path)) {
    auto configured = load_tokenizer(o);
    EXPECT_EQ(configured->eos_id(), 151645);
    EXPECT_EQ(configured->pad_id(), 151643);
  }
}

TEST(RealTokenizers, QwenVocabJsonAndMergesTxtMatchHfTokenizers) {
  std::string why;
  std::string path = real_file("qwen3/tokenizer.json", &why);
  if (path.empty()) GTEST_SKIP() << why;
  json ref = run_reference("hf", path, &why);
  if (ref.is_null()) GTEST_SKIP() << why;
  std::string dir = scratch() + "/qwen_vocab";
  std::string cmd = "python3 '" + script() + "' vocab '" + path + "' '" + dir + "'";
  if (std::system(cmd.c_str()) != 0) GTEST_SKIP() << "cannot write vocab.json + merges.txt: " << cmd;
  TokenizerOptions o;
  o.path = dir + "/vocab.json";
  o.config_path = data_dir() + "/qwen3/tokenizer_config.json";  // its added_tokens_decoder: Qwen3's specials
  if (!fs::exists(o.config_path)) GTEST_SKIP() << "missing " << o.config_path;
  auto tok = load_tokenizer(o);
  expect_same_ids(*tok, ref, false, "qwen vocab.json + merges.txt");
  // Without the config: torchtune's Qwen2.5 special tokens after the 151643 BPE tokens.
  o.config_path.clear();
  auto plain = load_tokenizer(o);
  EXPECT_EQ(plain->token_to_id("<|endoftext|>"), 151643);
  EXPECT_EQ(plain->token_to_id("<|im_end|>"), 151645);
  EXPECT_EQ(plain->token_to_id("<|file_sep|>"), 151664);
}

// The real Llama 3 and Qwen3 chat templates (their tokenizer_config.json) through
// ChatFormatKind::kTemplate against transformers' apply_chat_template, run at test time by
// fixtures/chat_template/chat_template_reference.py on the conversations of the fast test
// (tests/text/chat_template_test.cpp): text, ids and masks.
void expect_chat_template_matches_transformers(const std::string& model) {
  std::string why;
  const std::string tokenizer_json = real_file(model + "/tokenizer.json", &why);
  if (tokenizer_json.empty()) GTEST_SKIP() << why;
  const std::string config = data_dir() + "/" + model + "/tokenizer_config.json";
  if (!fs::exists(config)) GTEST_SKIP() << "missing " << config;
  const std::string dir = scratch() + "/" + model + "_model";  // tokenizer.json + config, as AutoTokenizer reads them
  fs::create_directories(dir);
  fs::copy_file(tokenizer_json, dir + "/tokenizer.json", fs::copy_options::overwrite_existing);
  fs::copy_file(config, dir + "/tokenizer_config.json", fs::copy_options::overwrite_existing);
  const std::string conversations = std::string(KTUNE_SOURCE_DIR) + "/tests/text/fixtures/chat_template/conversations.json";
  const std::string out = scratch() + "/" + model + "_chat_reference.json";
  const std::string cmd = "python3 '" + std::string(KTUNE_SOURCE_DIR) +
                          "/tests/text/fixtures/chat_template/chat_template_reference.py' '" + dir + "' '" + conversations +
                          "' > '" + out + "'";
  if (std::system("python3 -c 'import transformers' 2>/dev/null") != 0) GTEST_SKIP() << "transformers is not installed";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;  // a broken reference is no reason to skip
  const json expected = json::parse(std::ifstream(out));
  const json given = json::parse(std::ifstream(conversations));
  TokenizerOptions o;
  o.path = dir + "/tokenizer.json";
  o.config_path = dir + "/tokenizer_config.json";
  auto tokenizer = load_tokenizer(o);
  std::optional<HfChatTemplate> chat = HfChatTemplate::from_tokenizer_config(o.config_path);
  ASSERT_TRUE(chat.has_value());
  const ChatFormat format(*tokenizer, *chat, chat->eos_id(*tokenizer));
  ASSERT_EQ(expected.size(), given.size());
  for (size_t i = 0; i < given.size(); ++i) {
    SCOPED_TRACE(model + "/" + given[i]["name"].get<std::string>());
    std::vector<Message> messages;
    for (const json& m : given[i]["messages"]) messages.push_back(Message::text(m["role"], m["content"], m["masked"].get<bool>()));
    const bool add_end_tokens = given[i]["add_end_tokens"];
    const TokenizedMessages got = format.tokenize(messages, add_end_tokens);
    EXPECT_EQ(got.tokens, expected[i]["tokens"].get<std::vector<int32_t>>());
    EXPECT_EQ(got.mask, expected[i]["mask"].get<std::vector<uint8_t>>());
    if (!add_end_tokens && messages.back().role == "assistant") messages.pop_back();
    EXPECT_EQ(chat->render(messages, !add_end_tokens), expected[i]["text"].get<std::string>());
  }
}

TEST(RealTokenizers, Llama3ChatTemplateMatchesTransformers) { expect_chat_template_matches_transformers("llama3"); }
TEST(RealTokenizers, Qwen3ChatTemplateMatchesTransformers) { expect_chat_template_matches_transformers("qwen3"); }

}  // namespace
}  // namespace ktune
