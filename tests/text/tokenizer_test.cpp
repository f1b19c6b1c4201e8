// Proves ktune's tokenizers against the reference libraries on the committed fixtures
// (fixtures/make_tokenizer_fixtures.py: HF `tokenizers` and `sentencepiece` trained them and
// recorded their ids and decodes), and checks bad input gets errors that name the file and key.
#include <gtest/gtest.h>

#include <utf8proc.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "text/bpe_tokenizer.h"
#include "text/tokenize_lines.h"
#include "text/tokenizer.h"
#include "text/tokenizer_formats.h"
#include "text/unicode_text.h"

namespace ktune {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string fixtures() { return std::string(KTUNE_SOURCE_DIR) + "/tests/text/fixtures"; }

const json& reference() {
  static const json ref = [] {
    std::ifstream in(fixtures() + "/reference.json");
    return json::parse(in);
  }();
  return ref;
}

std::unique_ptr<Tokenizer> load_fixture(const std::string& name) {
  TokenizerOptions o;
  o.path = fixtures() + "/" + reference()["tokenizers"][name]["file"].get<std::string>();
  return load_tokenizer(o);
}

std::string scratch_dir(const std::string& name) {
  std::string dir = std::string(KTUNE_BINARY_DIR) + "/test_scratch/text/" + name;
  fs::create_directories(dir);
  return dir;
}

void write_file(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary);
  out << content;
}

// What HF's add_special_tokens=True adds, per fixture: the TemplateProcessing around $A.
struct Case {
  const char* name;
  bool bos, eos;  // the template adds BOS / EOS
};
const Case kCases[] = {{"byte_level", true, false}, {"byte_level_nfc", false, false}, {"qwen_vocab", false, false},
                       {"sp_style", true, true},    {"metaspace", true, true},        {"spm", true, true}};

class FixtureTokenizer : public ::testing::TestWithParam<Case> {};

TEST_P(FixtureTokenizer, EncodeMatchesReferenceIdsExactly) {
  auto tok = load_fixture(GetParam().name);
  const json& texts = reference()["texts"];
  const json& ref = reference()["tokenizers"][GetParam().name];
  ASSERT_GT(texts.size(), 80u);
  int mismatches = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    std::string text = texts[i].get<std::string>();
    std::vector<int32_t> want = ref["ids"][i].get<std::vector<int32_t>>();
    std::vector<int32_t> got = tok->encode(text);
    if (got != want && ++mismatches <= 5) ADD_FAILURE() << "text #" << i << " " << json(text).dump() << "\n want " << json(want).dump() << "\n got  " << json(got).dump();
  }
  EXPECT_EQ(mismatches, 0);
}

// Special tokens written in the text read as plain text (HF's split_special_tokens; SentencePiece's own).
TEST_P(FixtureTokenizer, EncodeOrdinaryMatchesReference) {
  auto tok = load_fixture(GetParam().name);
  const json& texts = reference()["texts"];
  const json& ref = reference()["tokenizers"][GetParam().name];
  for (size_t i = 0; i < texts.size(); ++i)
    EXPECT_EQ(tok->encode_ordinary(texts[i].get<std::string>()), ref["ids_ordinary"][i].get<std::vector<int32_t>>())
        << "text #" << i << " " << texts[i].dump();
}

TEST_P(FixtureTokenizer, BosEosMatchReferencePostProcessor) {
  auto tok = load_fixture(GetParam().name);
  const json& texts = reference()["texts"];
  const json& ref = reference()["tokenizers"][GetParam().name];
  for (size_t i = 0; i < texts.size(); ++i) {
    std::vector<int32_t> want = ref["ids_special"][i].get<std::vector<int32_t>>();
    EXPECT_EQ(tok->encode(texts[i].get<std::string>(), GetParam().bos, GetParam().eos), want) << "text #" << i;
  }
}

TEST_P(FixtureTokenizer, DecodeMatchesReference) {
  auto tok = load_fixture(GetParam().name);
  const json& ref = reference()["tokenizers"][GetParam().name];
  for (size_t i = 0; i < ref["ids"].size(); ++i) {
    std::vector<int32_t> ids = ref["ids"][i].get<std::vector<int32_t>>();
    EXPECT_EQ(tok->decode(ids), ref["decoded"][i].get<std::string>()) << "text #" << i;
    EXPECT_EQ(tok->decode(ids, true), ref["decoded_skip"][i].get<std::string>()) << "text #" << i << " (skip special)";
  }
}

TEST_P(FixtureTokenizer, VocabSizeMatchesReference) {
  auto tok = load_fixture(GetParam().name);
  EXPECT_EQ(tok->vocab_size(), reference()["tokenizers"][GetParam().name]["vocab_size"].get<int32_t>());
}

TEST_P(FixtureTokenizer, ConcurrentEncodesAgree) {
  auto tok = load_fixture(GetParam().name);
  const json& texts = reference()["texts"];
  std::vector<std::vector<std::vector<int32_t>>> results(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int round = 0; round < 3; ++round)
        for (const auto& text : texts) results[size_t(t)].push_back(tok->encode(text.get<std::string>()));
    });
  for (auto& th : threads) th.join();
  for (int t = 1; t < 4; ++t) EXPECT_EQ(results[size_t(t)], results[0]);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FixtureTokenizer, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param.name); });

// Lossless except where an added token's lstrip / rstrip swallows whitespace (<mask>, <tool_call>).
bool has_stripping_token(const std::string& text) {
  return text.find("<mask>") != std::string::npos || text.find("<tool_call>") != std::string::npos;
}

TEST(ByteLevelTokenizer, DecodeOfEncodeIsTheTextForEveryFixtureText) {
  auto tok = load_fixture("byte_level");
  for (const auto& t : reference()["texts"]) {
    std::string text = t.get<std::string>();
    if (has_stripping_token(text)) continue;
    EXPECT_EQ(tok->decode(tok->encode(text)), text);
  }
}

TEST(ByteLevelTokenizer, DecodeOfEncodeIsTheNfcTextWithNfcNormalizer) {
  auto tok = load_fixture("byte_level_nfc");
  for (const auto& t : reference()["texts"]) {
    std::string text = t.get<std::string>();
    if (has_stripping_token(text)) continue;
    EXPECT_EQ(tok->decode(tok->encode(text)), text::unicode_normalize(text, text::NormalForm::kNfc));
  }
}

TEST(ByteLevelTokenizer, SpecialIdsComeFromTemplateAndNames) {
  auto tok = load_fixture("byte_level");
  EXPECT_EQ(tok->bos_id(), tok->token_to_id("<|begin_of_text|>"));
  EXPECT_EQ(tok->eos_id(), tok->token_to_id("<|end_of_text|>"));
  ASSERT_TRUE(tok->token_to_id("<|eot_id|>").has_value());
  EXPECT_TRUE(tok->is_special(*tok->token_to_id("<|eot_id|>")));
  EXPECT_FALSE(tok->is_special(*tok->token_to_id("<tool_call>")));
  EXPECT_EQ(tok->id_to_token(*tok->token_to_id("<|eot_id|>")), "<|eot_id|>");
  EXPECT_FALSE(tok->token_to_id("no such token").has_value());
}

TEST(QwenVocabMerges, AddsQwen2SpecialTokensAfterTheVocabulary) {
  auto tok = load_fixture("qwen_vocab");
  json vocab = json::parse(std::ifstream(fixtures() + "/qwen_vocab/vocab.json"));
  int32_t base = int32_t(vocab.size());
  EXPECT_EQ(tok->token_to_id("<|endoftext|>"), base);
  EXPECT_EQ(tok->token_to_id("<|im_start|>"), base + 1);
  EXPECT_EQ(tok->token_to_id("<|im_end|>"), base + 2);
  EXPECT_EQ(tok->token_to_id("<|file_sep|>"), base + 21);
  EXPECT_FALSE(tok->bos_id().has_value());
  EXPECT_EQ(tok->eos_id(), base + 2);  // <|im_end|>: torchtune 0.6.1's Qwen2_5Tokenizer(eos_token=IM_END)
  EXPECT_EQ(tok->pad_id(), base);      // <|endoftext|>
}

TEST(QwenVocabMerges, ExplicitMergesFileIsUsed) {
  std::string dir = scratch_dir("qwen_explicit");
  fs::copy_file(fixtures() + "/qwen_vocab/vocab.json", dir + "/vocab.json", fs::copy_options::overwrite_existing);
  fs::copy_file(fixtures() + "/qwen_vocab/merges.txt", dir + "/my_merges.txt", fs::copy_options::overwrite_existing);
  fs::remove(dir + "/merges.txt");
  TokenizerOptions o;
  o.path = dir + "/vocab.json";
  o.merges_file = dir + "/my_merges.txt";
  auto tok = load_tokenizer(o);
  auto ref = load_fixture("qwen_vocab");
  EXPECT_EQ(tok->encode("Hello world, 123!"), ref->encode("Hello world, 123!"));
}

// The CLI reads the tokenizer_config.json beside a tokenizer, as AutoTokenizer does: a Qwen3-style
// vocab.json folder's added tokens (<think> past Qwen2.5's list) come from its added_tokens_decoder.
TEST(QwenVocabMerges, TheTokenizerConfigBesideItNamesItsAddedTokens) {
  std::string dir = scratch_dir("qwen_config_beside");
  for (const char* f : {"vocab.json", "merges.txt"})
    fs::copy_file(fixtures() + "/qwen_vocab/" + f, dir + "/" + f, fs::copy_options::overwrite_existing);
  fs::remove(dir + "/tokenizer_config.json");
  EXPECT_EQ(tokenizer_config_beside(dir + "/vocab.json"), "");
  const int32_t base = int32_t(json::parse(std::ifstream(dir + "/vocab.json")).size());
  json decoder = json::object();
  decoder[std::to_string(base)] = {{"content", "<|endoftext|>"}, {"special", true}};
  decoder[std::to_string(base + 1)] = {{"content", "<|im_end|>"}, {"special", true}};
  decoder[std::to_string(base + 2)] = {{"content", "<think>"}, {"special", false}};
  std::ofstream(dir + "/tokenizer_config.json") << json{{"added_tokens_decoder", decoder}, {"eos_token", "<|im_end|>"}}.dump();
  TokenizerOptions o;
  o.path = dir + "/vocab.json";
  o.config_path = tokenizer_config_beside(o.path);
  EXPECT_EQ(o.config_path, dir + "/tokenizer_config.json");
  auto tok = load_tokenizer(o);
  EXPECT_EQ(tok->encode("x<think>y", false, false).size(), 3u);
  EXPECT_EQ(tok->token_to_id("<think>"), base + 2);
  EXPECT_EQ(tok->decode({base + 2}, false), "<think>");
  EXPECT_EQ(tok->eos_id(), base + 1);
}

TEST(SentencePieceModel, ControlTokensAndIds) {
  auto tok = load_fixture("spm");
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_EQ(tok->pad_id(), 3);
  EXPECT_TRUE(tok->is_special(1));
  EXPECT_EQ(tok->token_to_id("<|eot_id|>").has_value(), true);
  EXPECT_EQ(tok->id_to_token(*tok->token_to_id("<mask>")), "<mask>");
}

// ---- bad input ----

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

std::string load_error(const std::string& path, const std::string& merges = "") {
  return error_of([&] {
    TokenizerOptions o;
    o.path = path;
    o.merges_file = merges;
    load_tokenizer(o);
  });
}

json fixture_json() { return json::parse(std::ifstream(fixtures() + "/byte_level/tokenizer.json")); }

TEST(TokenizerBadInput, MalformedJsonNamesTheFile) {
  std::string path = scratch_dir("bad") + "/truncated.json";
  std::string content = fixture_json().dump();
  write_file(path, content.substr(0, content.size() / 2));
  std::string msg = load_error(path);
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("not valid JSON"), std::string::npos) << msg;
}

TEST(TokenizerBadInput, MissingOrWrongKeysAreNamed) {
  std::string dir = scratch_dir("bad");
  struct Mutation {
    const char* key_in_message;
    void (*mutate)(json&);
  };
  const Mutation mutations[] = {
      {"model.vocab", [](json& j) { j["model"].erase("vocab"); }},
      {"model.merges[3]", [](json& j) { j["model"]["merges"][3] = 7; }},
      {"model.merges[0]", [](json& j) { j["model"]["merges"][0] = json::array({"no-such-token", "x"}); }},
      {"model.type", [](json& j) { j["model"]["type"] = "Unigram"; }},
      {"normalizer.type", [](json& j) { j["normalizer"] = {{"type", "Precompiled"}}; }},
      {"pre_tokenizer.pretokenizers[0].pattern.Regex", [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed"; }},
      {"decoder.type", [](json& j) { j["decoder"] = {{"type", "WordPiece"}}; }},
      {"added_tokens[0].id", [](json& j) { j["added_tokens"][0]["id"] = "seven"; }},
  };
  for (const Mutation& m : mutations) {
    json j = fixture_json();
    m.mutate(j);
    std::string path = dir + "/mutated.json";
    write_file(path, j.dump());
    std::string msg = load_error(path);
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find(m.key_in_message), std::string::npos) << "expected '" << m.key_in_message << "' in: " << msg;
  }
}

TEST(TokenizerBadInput, MissingFileIsNamed) {
  std::string msg = load_error("/nonexistent/tokenizer.json");
  EXPECT_NE(msg.find("/nonexistent/tokenizer.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cannot open"), std::string::npos) << msg;
}

TEST(TokenizerBadInput, VocabJsonWithoutMergesNamesTheMissingFile) {
  std::string dir = scratch_dir("no_merges");
  fs::copy_file(fixtures() + "/qwen_vocab/vocab.json", dir + "/vocab.json", fs::copy_options::overwrite_existing);
  fs::remove(dir + "/merges.txt");
  std::string msg = load_error(dir + "/vocab.json");
  EXPECT_NE(msg.find(dir + "/merges.txt"), std::string::npos) << msg;
  msg = load_error(dir + "/vocab.json", dir + "/other_merges.txt");
  EXPECT_NE(msg.find(dir + "/other_merges.txt"), std::string::npos) << msg;
}

TEST(TokenizerBadInput, MalformedMergesLineIsNamed) {
  std::string dir = scratch_dir("bad_merges");
  fs::copy_file(fixtures() + "/qwen_vocab/vocab.json", dir + "/vocab.json", fs::copy_options::overwrite_existing);
  std::ifstream good(fixtures() + "/qwen_vocab/merges.txt");
  std::string version, first;
  std::getline(good, version);
  std::getline(good, first);
  write_file(dir + "/merges.txt", version + "\n" + first + "\nthree tokens here\n");
  std::string msg = load_error(dir + "/vocab.json");
  EXPECT_NE(msg.find(dir + "/merges.txt: line 3"), std::string::npos) << msg;
}

TEST(TokenizerBadInput, MalformedTiktokenLineIsNamed) {
  std::string path = scratch_dir("bad_tiktoken") + "/tokenizer.model";
  write_file(path, "IQ== 0\nIg== 1\nIw 2\n");
  std::string msg = load_error(path);
  EXPECT_NE(msg.find(path + ":3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("base64"), std::string::npos) << msg;
  write_file(path, "IQ== 0\nIg== one\n");
  msg = load_error(path);
  EXPECT_NE(msg.find(path + ":2"), std::string::npos) << msg;
}

TEST(TokenizerBadInput, UnknownBinaryFileIsRefused) {
  std::string path = scratch_dir("bad") + "/garbage.bin";
  write_file(path, std::string("\x01\x02garbage\xff\xfe", 11));
  std::string msg = load_error(path);
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("not a tokenizer.json"), std::string::npos) << msg;
}

// Documented choice: invalid UTF-8 is an error (with the byte offset), never silently replaced.
TEST(TokenizerBadInput, InvalidUtf8TextIsAnErrorWithTheByteOffset) {
  for (const Case& c : kCases) {
    auto tok = load_fixture(c.name);
    for (std::string bad : {std::string("abc\xff"), std::string("abc\xc3"), std::string("abc\xed\xa0\x80"),
                            std::string("abc\xc0\xaf")}) {
      std::string msg = error_of([&] { tok->encode(bad); });
      EXPECT_NE(msg.find("invalid UTF-8 at byte 3"), std::string::npos) << c.name << ": " << msg;
    }
  }
}

TEST(TokenizerBadInput, DecodingAnIdOutsideTheVocabularyIsAnError) {
  for (const Case& c : kCases) {
    auto tok = load_fixture(c.name);
    std::string msg = error_of([&] { tok->decode({0, tok->vocab_size()}); });
    EXPECT_NE(msg.find("outside the vocabulary"), std::string::npos) << c.name << ": " << msg;
  }
}

// ---- tiktoken on a small rank file built from the byte-level fixture ----

TEST(TiktokenTokenizer, RankFileLoadsAndRoundTrips) {
  // Every single byte plus a few merged tokens, in rank order.
  std::string dir = scratch_dir("tiktoken");
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(std::string(1, char(b)));
  for (const char* t : {"he", "ll", "hell", "hello", " w", " wor", " world", "or"}) tokens.push_back(t);
  static const char* kB64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string file;
  for (size_t r = 0; r < tokens.size(); ++r) {
    const std::string& s = tokens[r];
    std::string enc;
    for (size_t i = 0; i < s.size(); i += 3) {
      uint32_t v = uint32_t((unsigned char)s[i]) << 16;
      if (i + 1 < s.size()) v |= uint32_t((unsigned char)s[i + 1]) << 8;
      if (i + 2 < s.size()) v |= uint32_t((unsigned char)s[i + 2]);
      enc += kB64[(v >> 18) & 63];
      enc += kB64[(v >> 12) & 63];
      enc += i + 1 < s.size() ? kB64[(v >> 6) & 63] : '=';
      enc += i + 2 < s.size() ? kB64[v & 63] : '=';
    }
    file += enc + " " + std::to_string(r) + "\n";
  }
  write_file(dir + "/tokenizer.model", file);
  TokenizerOptions o;
  o.path = dir + "/tokenizer.model";
  auto tok = load_tokenizer(o);
  EXPECT_EQ(tok->vocab_size(), 264 + 256);
  EXPECT_EQ(tok->bos_id(), 264);
  EXPECT_EQ(tok->eos_id(), 265);
  EXPECT_EQ(tok->pad_id(), 268);
  EXPECT_EQ(tok->token_to_id("<|eot_id|>"), 264 + 9);
  EXPECT_EQ(tok->token_to_id("<|reserved_special_token_246|>"), 264 + 255);
  // Ranks: bytes 0-255, he 256, ll 257, hell 258, hello 259, " w" 260, " wor" 261, " world" 262, or 263.
  // "hello" and " world" are tokens: taken whole. "hellx": he (256) before ll (257), then hell, then x.
  EXPECT_EQ(tok->encode("hello world"), (std::vector<int32_t>{259, 262}));
  EXPECT_EQ(tok->encode("hellx"), (std::vector<int32_t>{258, 'x'}));
  EXPECT_EQ(tok->encode("<|begin_of_text|>hi<|eot_id|>", true),
            (std::vector<int32_t>{264, 264, 'h', 'i', 264 + 9}));
  for (std::string s : {"hello world", "héllo wörld 中文 👋🏽", "  \n\t x"}) EXPECT_EQ(tok->decode(tok->encode(s)), s);
  EXPECT_EQ(tok->decode(tok->encode("<|begin_of_text|>hi<|eot_id|>"), true), "hi");
}

// ---- Unicode pieces ----

TEST(UnicodeText, NormalizationQuickCheckNeverSkipsAChangingCodePoint) {
  // Every code point alone, and followed by a combining acute: the shortcut must agree with utf8proc.
  const bool sanitized = std::getenv("KTUNE_SANITIZED") != nullptr;
  const char32_t step = sanitized ? 7 : 1;
  for (char32_t cp = 0x80; cp < 0x30000; cp += step) {
    if (cp >= 0xD800 && cp < 0xE000) continue;
    std::string s;
    text::utf8_append(s, cp);
    for (std::string t : {s, s + "\xCC\x81"}) {
      for (auto [form, opt] : {std::pair{text::NormalForm::kNfc, int(UTF8PROC_COMPOSE)},
                               std::pair{text::NormalForm::kNfkc, int(UTF8PROC_COMPOSE | UTF8PROC_COMPAT)}}) {
        utf8proc_uint8_t* ref = nullptr;
        utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(t.data()), utf8proc_ssize_t(t.size()), &ref,
                                          utf8proc_option_t(UTF8PROC_STABLE | opt));
        ASSERT_GE(n, 0);
        std::string want(reinterpret_cast<char*>(ref), size_t(n));
        std::free(ref);
        ASSERT_EQ(text::unicode_normalize(t, form), want) << "U+" << std::hex << uint32_t(cp);
      }
    }
  }
}

TEST(UnicodeText, LossyDecodingReplacesEachMaximalInvalidSubpart) {
  // The cases of Unicode's "U+FFFD substitution of maximal subparts" (Python's errors="replace").
  EXPECT_EQ(text::utf8_lossy("a\xF1\x80\x80" "b"), "a\xEF\xBF\xBD" "b");
  EXPECT_EQ(text::utf8_lossy("\xE0\x80\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(text::utf8_lossy("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(text::utf8_lossy("\xC3\xA9\xFF"), "\xC3\xA9\xEF\xBF\xBD");
  EXPECT_EQ(text::find_invalid_utf8("plain ascii text, long enough for the fast path"), std::string::npos);
  EXPECT_EQ(text::find_invalid_utf8("0123456789\x80"), 10u);
}

// ---- ktune tokenize's engine ----

TEST(TokenizeJsonLines, EncodesAndDecodesOneJsonValuePerLine) {
  auto tok = load_fixture("byte_level");
  std::istringstream in("\"Hello world\"\n\n\"中文 👋\"\n");
  std::ostringstream out;
  EXPECT_EQ(tokenize_json_lines(*tok, in, out, {}, "stdin"), 3u);
  std::istringstream lines(out.str());
  std::string a, blank, c;
  std::getline(lines, a);
  std::getline(lines, blank);
  std::getline(lines, c);
  EXPECT_EQ(json::parse(a).get<std::vector<int32_t>>(), tok->encode("Hello world"));
  EXPECT_EQ(blank, "");
  EXPECT_EQ(json::parse(c).get<std::vector<int32_t>>(), tok->encode("中文 👋"));

  std::istringstream back(out.str());
  std::ostringstream decoded;
  TokenizeLinesOptions opt;
  opt.decode = true;
  tokenize_json_lines(*tok, back, decoded, opt, "stdin");
  EXPECT_EQ(decoded.str(), "\"Hello world\"\n\n\"中文 👋\"\n");

  std::istringstream with_bos("\"x\"\n");
  std::ostringstream bos_out;
  TokenizeLinesOptions bos_opt;
  bos_opt.add_bos = true;
  tokenize_json_lines(*tok, with_bos, bos_out, bos_opt, "stdin");
  EXPECT_EQ(json::parse(bos_out.str())[0].get<int32_t>(), *tok->bos_id());
}

TEST(TokenizeJsonLines, BadLinesAreNamedByLineNumber) {
  auto tok = load_fixture("byte_level");
  std::istringstream in("\"ok\"\nnot json\n");
  std::ostringstream out;
  std::string msg = error_of([&] { tokenize_json_lines(*tok, in, out, {}, "input.jsonl"); });
  EXPECT_NE(msg.find("input.jsonl:2"), std::string::npos) << msg;
  std::istringstream in2("[1, 2]\n");
  msg = error_of([&] { tokenize_json_lines(*tok, in2, out, {}, "input.jsonl"); });
  EXPECT_NE(msg.find("expected a JSON string"), std::string::npos) << msg;
  // Ids past 32 bits are named as written, never wrapped into another id (2^32 + 65 read as 65).
  TokenizeLinesOptions decode;
  decode.decode = true;
  for (const char* ids : {"[4294967361]", "[-4294967231]", "[18446744073709551615]"}) {
    std::istringstream big(std::string(ids) + "\n");
    msg = error_of([&] { tokenize_json_lines(*tok, big, out, decode, "ids.jsonl"); });
    const std::string id = std::string(ids).substr(1, std::string(ids).size() - 2);
    EXPECT_NE(msg.find("ids.jsonl:1: cannot decode id " + id + ": outside the vocabulary"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace ktune
