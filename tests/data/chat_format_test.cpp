// Chat formats against torchtune 0.6.1's tokenize_messages (fixtures/chat_format_cases.json):
// every message set × format × max_seq_len × add_end must give the same ids and the same mask.
#include <gtest/gtest.h>

#include "core/error.h"
#include "fixture_cases.h"
#include "text/chat_format.h"

namespace ktune {
namespace {

using testing::load_json;

std::vector<Message> messages_from(const nlohmann::json& list) {
  std::vector<Message> out;
  for (const auto& m : list) {
    Message msg;
    msg.role = m.at("role");
    msg.content = m.at("content").get<std::vector<std::string>>();
    msg.masked = m.at("masked");
    msg.ipython = m.at("ipython");
    msg.eot = m.at("eot");
    out.push_back(std::move(msg));
  }
  return out;
}

TEST(ChatFormat, MatchesTorchtuneTokenizeMessagesOnEveryFixtureCase) {
  nlohmann::json cases = load_json(testing::fixtures_dir() + "/chat_format_cases.json");
  ASSERT_GT(cases.size(), 200u);
  int checked = 0, truncated = 0;
  for (const auto& c : cases) {
    const std::string format = c.at("format");
    auto tok = testing::tokenizer_for(format);
    ChatFormat chat(*tok, parse_chat_format(format), c.at("max_seq_len").get<int64_t>());
    TokenizedMessages got = chat.tokenize(messages_from(c.at("messages")), c.at("add_end").get<bool>());
    std::vector<int32_t> want_tokens = c.at("tokens").get<std::vector<int32_t>>();
    std::vector<bool> want_mask = c.at("mask").get<std::vector<bool>>();
    std::vector<bool> got_mask(got.mask.begin(), got.mask.end());
    const std::string label = c.at("name").get<std::string>() + " / " + format + " / max_seq_len " +
                              std::to_string(c.at("max_seq_len").get<int>()) + " / add_end " +
                              (c.at("add_end").get<bool>() ? "true" : "false");
    ASSERT_EQ(got.tokens, want_tokens) << label << "\n  text: " << tok->decode(got.tokens);
    ASSERT_EQ(got_mask, want_mask) << label;
    truncated += got.truncated;
    ++checked;
  }
  EXPECT_EQ(checked, (int)cases.size());
  EXPECT_GT(truncated, 10);  // the small max_seq_len cases do cut
}

// torchtune's tag templates (tokenizer.prompt_template) around a conversation's messages, against
// its Llama 3 and Qwen 2.5 tokenize_messages (fixtures/prompt_template_cases.json): the template's
// tags as torchtune defines them, the same ids and the same mask, cut to max_seq_len or not.
TEST(ChatFormat, PromptTemplatesMatchTorchtuneOnEveryFixtureCase) {
  nlohmann::json cases = load_json(testing::fixtures_dir() + "/prompt_template_cases.json");
  ASSERT_EQ(cases.size(), 16u);
  for (const auto& c : cases) {
    PromptTemplate tpl;
    for (const auto& [role, tags] : c.at("tags").items()) tpl.tags[role] = {tags.at(0), tags.at(1)};
    const std::string format = c.at("format");
    auto tok = testing::tokenizer_for(format);
    ChatFormat chat(*tok, parse_chat_format(format), c.at("max_seq_len").get<int64_t>(), tpl);
    TokenizedMessages got = chat.tokenize(messages_from(c.at("messages")), true);
    std::vector<bool> got_mask(got.mask.begin(), got.mask.end());
    const std::string label = c.at("template").dump() + " / " + format + " / max_seq_len " + c.at("max_seq_len").dump();
    EXPECT_EQ(got.tokens, c.at("tokens").get<std::vector<int32_t>>()) << label << "\n  text: " << tok->decode(got.tokens);
    EXPECT_EQ(got_mask, c.at("mask").get<std::vector<bool>>()) << label;
  }
}

TEST(ChatFormat, Llama3AssistantHeaderIsTrainedAndPromptIsMasked) {
  testing::ByteTokenizer tok(testing::ByteTokenizer::Flavour::kLlama3);
  ChatFormat chat(tok, ChatFormatKind::kLlama3);
  auto t = chat.tokenize({Message::text("user", "hi", true), Message::text("assistant", "yo", false)});
  // <bos> <sh> user <eh> \n\n h i <eot> | <sh> assistant <eh> \n\n y o <eot> | <eos>
  const int32_t bos = 256, eos = 257, sh = 258, eh = 259, eot = 260;
  std::vector<int32_t> want = {bos, sh, 'u', 's', 'e', 'r', eh, '\n', '\n', 'h', 'i', eot, sh};
  for (char ch : std::string("assistant")) want.push_back(ch);
  for (int32_t id : {eh, (int32_t)'\n', (int32_t)'\n', (int32_t)'y', (int32_t)'o', eot, eos}) want.push_back(id);
  EXPECT_EQ(t.tokens, want);
  const size_t user_end = 12;  // bos + user message
  for (size_t i = 0; i < t.mask.size(); ++i) {
    bool expect_masked = i < user_end || i + 1 == t.mask.size();  // the final <|end_of_text|> is masked
    EXPECT_EQ(t.mask[i] != 0, expect_masked) << "token " << i;
  }
  EXPECT_FALSE(t.truncated);
}

TEST(ChatFormat, TruncationKeepsTheEndTokenAndReportsIt) {
  testing::ByteTokenizer tok(testing::ByteTokenizer::Flavour::kQwen);
  ChatFormat chat(tok, ChatFormatKind::kChatML, 10);
  auto t = chat.tokenize({Message::text("user", "a long question here", true), Message::text("assistant", "answer", false)});
  ASSERT_EQ(t.tokens.size(), 10u);
  EXPECT_EQ(t.tokens.back(), *tok.token_to_id("<|im_end|>"));
  EXPECT_EQ(t.mask.back(), 1);
  EXPECT_TRUE(t.truncated);
  ChatFormat roomy(tok, ChatFormatKind::kChatML, 1000);
  EXPECT_FALSE(roomy.tokenize({Message::text("user", "q", true), Message::text("assistant", "a", false)}).truncated);
}

TEST(ChatFormat, ParsesNamesAndRejectsUnknownOnes) {
  EXPECT_EQ(parse_chat_format("qwen2_5"), ChatFormatKind::kChatML);
  EXPECT_EQ(parse_chat_format("llama3_2"), ChatFormatKind::kLlama3);
  EXPECT_EQ(parse_chat_format("gemma2"), ChatFormatKind::kGemma);
  try {
    parse_chat_format("vicuna");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("vicuna"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("llama3"), std::string::npos);
  }
}

TEST(ChatFormat, MapsTorchtuneTokenizerBuildersToFormats) {
  EXPECT_EQ(chat_format_for_tokenizer_component("torchtune.models.llama3.llama3_tokenizer"), ChatFormatKind::kLlama3);
  EXPECT_EQ(chat_format_for_tokenizer_component("torchtune.models.qwen2_5.qwen2_5_tokenizer"), ChatFormatKind::kChatML);
  EXPECT_EQ(chat_format_for_tokenizer_component("torchtune.models.mistral.mistral_tokenizer"), ChatFormatKind::kMistral);
  EXPECT_EQ(chat_format_for_tokenizer_component("torchtune.models.gemma.gemma_tokenizer"), ChatFormatKind::kPlain);
  EXPECT_EQ(chat_format_for_tokenizer_component("torchtune.models.phi3.phi3_mini_tokenizer"), std::nullopt);
  EXPECT_EQ(chat_format_for_tokenizer_component("torchtune.models.llama3.llama3_8b"), std::nullopt);
}

TEST(ChatFormat, DetectsTheFormatFromSpecialTokens) {
  using F = testing::ByteTokenizer::Flavour;
  EXPECT_EQ(detect_chat_format(testing::ByteTokenizer(F::kLlama3)), ChatFormatKind::kLlama3);
  EXPECT_EQ(detect_chat_format(testing::ByteTokenizer(F::kQwen)), ChatFormatKind::kChatML);
  EXPECT_EQ(detect_chat_format(testing::ByteTokenizer(F::kGemma)), ChatFormatKind::kGemma);
  EXPECT_EQ(detect_chat_format(testing::ByteTokenizer(F::kSentencePiece)), ChatFormatKind::kPlain);
}

TEST(ChatFormat, FormatThatNeedsMissingSpecialTokensFailsAtConstruction) {
  testing::ByteTokenizer sp(testing::ByteTokenizer::Flavour::kSentencePiece);
  EXPECT_THROW(ChatFormat(sp, ChatFormatKind::kLlama3), Error);
  EXPECT_THROW(ChatFormat(sp, ChatFormatKind::kChatML), Error);
}

TEST(ChatFormat, MistralRejectsSystemPrompts) {
  testing::ByteTokenizer sp(testing::ByteTokenizer::Flavour::kSentencePiece);
  ChatFormat chat(sp, ChatFormatKind::kMistral);
  EXPECT_THROW(chat.tokenize({Message::text("system", "s", true), Message::text("user", "u", true),
                              Message::text("assistant", "a")}),
               Error);
}

TEST(PromptTemplate, AlpacaPromptIsTorchtunesWording) {
  EXPECT_EQ(alpaca_prompt("Do X.", ""),
            "Below is an instruction that describes a task. Write a response that appropriately completes the "
            "request.\n\n### Instruction:\nDo X.\n\n### Response:\n");
  EXPECT_EQ(alpaca_prompt("Do X.", "with Y"),
            "Below is an instruction that describes a task, paired with an input that provides further context. "
            "Write a response that appropriately completes the request.\n\n### Instruction:\nDo X.\n\n### "
            "Input:\nwith Y\n\n### Response:\n");
}

TEST(PromptTemplate, ValidateMessagesRejectsBadOrders) {
  EXPECT_THROW(validate_messages({Message::text("user", "u")}, "row"), Error);
  EXPECT_THROW(validate_messages({Message::text("assistant", "a"), Message::text("user", "u")}, "row"), Error);
  EXPECT_THROW(validate_messages({Message::text("user", "a"), Message::text("user", "u")}, "row"), Error);
  EXPECT_THROW(validate_messages({Message::text("user", "a"), Message::text("system", "s")}, "row"), Error);
  EXPECT_NO_THROW(validate_messages({Message::text("system", "s"), Message::text("user", "u"), Message::text("assistant", "a")}, "row"));
}

}  // namespace
}  // namespace ktune
