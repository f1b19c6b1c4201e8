// End to end with the real tokenizers (where ../shared/data/tokenizers is present, or
// KTUNE_TOKENIZERS points at a copy): ktune's own Llama 3 tiktoken and Qwen3 tokenizer.json
// loaders + chat formats + builders, against torchtune 0.6.1's Llama3Tokenizer and
// Qwen2_5Tokenizer over the same datasets (fixtures/real_tokenizer_cases.json, ids only).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "data/dataset_builders.h"
#include "fixture_cases.h"

namespace ktune {
namespace {

namespace fs = std::filesystem;

std::string tokenizers_root() {
  if (const char* env = std::getenv("KTUNE_TOKENIZERS")) return env;
  return std::string(KTUNE_SOURCE_DIR) + "/../shared/data/tokenizers";
}

// The decompressed file (cached under the build tree), or "" when the .xz is not there.
std::string unpacked(const std::string& relative) {
  const fs::path xz = fs::path(tokenizers_root()) / (relative + ".xz");
  if (!fs::exists(xz)) return "";
  const fs::path out = fs::path(KTUNE_BINARY_DIR) / "data_test_tokenizers" / relative;
  if (!fs::exists(out)) {
    fs::create_directories(out.parent_path());
    const std::string tmp = out.string() + ".part";
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

}  // namespace
}  // namespace ktune
