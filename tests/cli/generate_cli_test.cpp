// `ktune generate` through the built binary, on a fresh tiny model (the quickstart's, random
// weights): --prompts answers each line as --prompt answers it alone; --template alpaca asks a row
// with the prompt alpaca_dataset trains on (with the "### Input:" block only where the row has an
// input, as torchtune does); --adapter puts a LoRA run's adapter on the base as its merged model
// has it; sampling follows its seed; bad lines and flag mixes are refused naming the file and line.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/prompt_template.h"
#include "tiny_recipe_run.h"

namespace ktune {
namespace {

namespace fs = std::filesystem;
using recipe_testing::kKtune;
using recipe_testing::kSource;
using recipe_testing::Outcome;
using recipe_testing::sh;

class GenerateCli : public recipe_testing::TinyModelRecipeTest {
 protected:
  std::string write(const std::string& name, const std::vector<nlohmann::json>& lines) const {
    const std::string path = (dir_ / name).string();
    std::ofstream f(path);
    for (const auto& line : lines) f << line.dump() << "\n";
    return path;
  }
  std::string generate(const std::string& flags) const {
    return kKtune + " generate --model " + model() + " --chat --max-new-tokens 6 " + flags;
  }
  // Its stdout only (sh adds 2>&1 after the whole command).
  static Outcome quiet(const std::string& command) { return sh("(" + command + " 2>/dev/null)"); }
  // The answer to one prompt, given alone (its output is the text and a newline).
  std::string answer_alone(const std::string& prompt) const {
    const std::string path = (dir_ / "prompt.txt").string();
    std::ofstream(path) << prompt;
    Outcome r = quiet(generate("--prompt \"$(cat " + path + ")\""));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return r.output.substr(0, r.output.size() - 1);
  }
  // One JSON string a line.
  static std::vector<std::string> answers_of(const std::string& output) {
    std::vector<std::string> answers;
    std::istringstream lines(output);
    for (std::string line; std::getline(lines, line);) answers.push_back(nlohmann::json::parse(line).get<std::string>());
    return answers;
  }
};

TEST_F(GenerateCli, AlpacaRowsAreAskedWithTheTrainingPromptOneAnswerALine) {
  const std::vector<nlohmann::json> rows = {
      {{"instruction", "Sort the numbers from smallest to largest."}, {"input", "4, 3, 1"}, {"output", "1, 3, 4"}},
      {{"instruction", "What number comes after 41?"}, {"input", ""}, {"output", "42"}},
      {{"instruction", "What number comes after 7?"}, {"input", nullptr}},
      {{"instruction", "What number comes after 7?"}},
  };
  Outcome r = quiet(generate("--prompts " + write("rows.jsonl", rows) + " --template alpaca"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto answers = answers_of(r.output);
  ASSERT_EQ(answers.size(), rows.size()) << r.output;
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::string input = rows[i].contains("input") && rows[i]["input"].is_string() ? rows[i]["input"].get<std::string>() : "";
    EXPECT_EQ(answers[i], answer_alone(alpaca_prompt(rows[i]["instruction"], input))) << "row " << i;
  }
  // The prompts themselves (--dry-run): alpaca_dataset's, with the "### Input:" block only where
  // the row has an input.
  Outcome dry = quiet(generate("--prompts " + (dir_ / "rows.jsonl").string() + " --template alpaca --dry-run"));
  ASSERT_EQ(dry.exit_code, 0) << dry.output;
  const auto prompts = answers_of(dry.output);
  ASSERT_EQ(prompts.size(), rows.size()) << dry.output;
  EXPECT_EQ(prompts[0],
            "Below is an instruction that describes a task, paired with an input that provides further context. Write a "
            "response that appropriately completes the request.\n\n### Instruction:\nSort the numbers from smallest to "
            "largest.\n\n### Input:\n4, 3, 1\n\n### Response:\n");
  for (size_t i = 1; i < rows.size(); ++i) {
    EXPECT_EQ(prompts[i].find("### Input:"), std::string::npos) << prompts[i];
    EXPECT_EQ(prompts[i], alpaca_prompt(rows[i]["instruction"], "")) << "row " << i;
  }
  // A dry run needs no model.
  EXPECT_EQ(quiet(kKtune + " generate --model " + (dir_ / "nowhere").string() + " --prompts " +
                  (dir_ / "rows.jsonl").string() + " --template alpaca --dry-run").output, dry.output);
}

TEST_F(GenerateCli, PromptLinesAreAnsweredAsEachAlone) {
  const std::vector<nlohmann::json> prompts = {"Reverse the list.\n\n1, 2, 3", "What number comes after 9?"};
  Outcome r = quiet(generate("--prompts " + write("prompts.jsonl", prompts)));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto answers = answers_of(r.output);
  ASSERT_EQ(answers.size(), 2u) << r.output;
  EXPECT_EQ(answers[0], answer_alone(prompts[0]));
  EXPECT_EQ(answers[1], answer_alone(prompts[1]));
  // stdin, as "-".
  Outcome piped = quiet("cat " + (dir_ / "prompts.jsonl").string() + " | " + generate("--prompts -"));
  ASSERT_EQ(piped.exit_code, 0) << piped.output;
  EXPECT_EQ(answers_of(piped.output), answers);
}

// The ids a model's generation_config.json ends answers with stop them, as HF's generate(): here
// every id is one, so every answer (greedy or by beams) is empty; a malformed list is named; without
// the file, config.json's eos_token_id does the same.
TEST_F(GenerateCli, TheGenerationConfigsEosIdsEndAnswers) {
  const fs::path copy = dir_ / "model-eos";
  fs::copy(model(), copy, fs::copy_options::recursive);
  std::ifstream config_file(copy / "config.json");
  const int64_t vocab = nlohmann::json::parse(config_file)["vocab_size"].get<int64_t>();
  nlohmann::json eos = nlohmann::json::array();
  for (int64_t id = 0; id < vocab; ++id) eos.push_back(id);
  std::ofstream(copy / "generation_config.json") << nlohmann::json{{"eos_token_id", eos}}.dump();
  const std::string ask = kKtune + " generate --model " + copy.string() + " --chat --max-new-tokens 6 --prompt 'What comes after 9?'";
  EXPECT_NE(answer_alone("What comes after 9?"), "");  // the model itself answers
  Outcome greedy = quiet(ask);
  ASSERT_EQ(greedy.exit_code, 0) << greedy.output;
  EXPECT_EQ(greedy.output, "\n");
  Outcome beams = quiet(ask + " --num-beams 2");
  ASSERT_EQ(beams.exit_code, 0) << beams.output;
  EXPECT_EQ(beams.output, "\n");
  std::ofstream(copy / "generation_config.json") << R"({"eos_token_id": ["2"]})";
  Outcome bad = sh(ask);
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("generation_config.json: eos_token_id"), std::string::npos) << bad.output;
  // Without a generation config, config.json's list stands in for it.
  fs::remove(copy / "generation_config.json");
  nlohmann::json config = nlohmann::json::parse(std::ifstream(copy / "config.json"));
  config["eos_token_id"] = eos;
  std::ofstream(copy / "config.json") << config.dump();
  Outcome from_config = quiet(ask);
  ASSERT_EQ(from_config.exit_code, 0) << from_config.output;
  EXPECT_EQ(from_config.output, "\n");
}

// --chat-template asks through the model's own chat template (tokenizer_config.json): one that
// renders BOS and the prompt as they are answers as the plain prompt does (the same ids), one with
// a generation prompt answers otherwise; a model without a template, or both chat flags, are refused.
TEST_F(GenerateCli, ChatTemplateAsksThroughTheModelsOwnTemplate) {
  const std::string ask = kKtune + " generate --model " + model() + " --max-new-tokens 6 --prompt 'What comes after 9?'";
  Outcome none = sh(ask + " --chat-template");
  EXPECT_NE(none.exit_code, 0);
  EXPECT_NE(none.output.find("--chat-template: " + model() + "/tokenizer_config.json has no chat_template"),
            std::string::npos) << none.output;
  Outcome both = sh(ask + " --chat --chat-template");
  EXPECT_NE(both.exit_code, 0);
  EXPECT_NE(both.output.find("--chat and --chat-template are two ways to ask: give one"), std::string::npos) << both.output;

  const std::string config_path = model() + "/tokenizer_config.json";
  nlohmann::json config = nlohmann::json::parse(std::ifstream(config_path));
  config["chat_template"] = "{{ bos_token + messages[0].content }}{% if add_generation_prompt %}{% endif %}";
  std::ofstream(config_path) << config.dump(1);
  Outcome plain = quiet(ask);
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  Outcome templated = quiet(ask + " --chat-template");
  ASSERT_EQ(templated.exit_code, 0) << templated.output;
  EXPECT_EQ(templated.output, plain.output);

  config["chat_template"] = "{{ bos_token + messages[0].content }}{% if add_generation_prompt %}\n\nAnswer: {% endif %}";
  std::ofstream(config_path) << config.dump(1);
  Outcome prompted = quiet(ask + " --chat-template");
  ASSERT_EQ(prompted.exit_code, 0) << prompted.output;
  Outcome by_hand = quiet(kKtune + " generate --model " + model() + " --max-new-tokens 6 --prompt \"$(printf 'What comes after 9?\\n\\nAnswer: ')\"");
  ASSERT_EQ(by_hand.exit_code, 0) << by_hand.output;
  EXPECT_EQ(prompted.output, by_hand.output);

  // --tools: the schemas reach the template as `tools` (tojson keeps the file's key order), as
  // apply_chat_template(tools=...) hands them over; the answer is the one to the rendered text.
  config["chat_template"] = "{{ bos_token }}{% if tools %}{{ tools | tojson }}\n{% endif %}{{ messages[0].content }}";
  std::ofstream(config_path) << config.dump(1);
  const std::string files = (dir_ / "tool_files").string();
  fs::create_directories(files);
  std::ofstream(files + "/tools.json") << R"([{"name": "next", "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}}, "b": 1, "a": 2}])";
  Outcome with_tools = quiet(ask + " --chat-template --tools " + files + "/tools.json");
  ASSERT_EQ(with_tools.exit_code, 0) << with_tools.output;
  std::ofstream(files + "/rendered.txt")
      << R"([{"name": "next", "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}}, "b": 1, "a": 2}])"
      << "\nWhat comes after 9?";
  Outcome tools_by_hand = quiet(kKtune + " generate --model " + model() + " --max-new-tokens 6 --prompt \"$(cat " + files +
                                "/rendered.txt)\"");
  ASSERT_EQ(tools_by_hand.exit_code, 0) << tools_by_hand.output;
  EXPECT_EQ(with_tools.output, tools_by_hand.output);
  EXPECT_NE(with_tools.output, quiet(ask + " --chat-template").output);  // the tools changed the prompt
  Outcome no_template = sh(ask + " --tools " + files + "/tools.json");
  EXPECT_NE(no_template.output.find("--tools: offers tools through the model's own chat template"), std::string::npos)
      << no_template.output;
  std::ofstream(files + "/not_a_list.json") << R"({"name": "next"})";
  Outcome not_a_list = sh(ask + " --chat-template --tools " + files + "/not_a_list.json");
  EXPECT_NE(not_a_list.output.find("not_a_list.json: holds a JSON object; --tools takes a list of tool schemas"),
            std::string::npos) << not_a_list.output;
}

// A LoRA run's adapter put on the base (--adapter) answers as the merged model the run wrote beside
// it, and unlike the base alone; so does the adapter of a run that saved only the adapter.
TEST_F(GenerateCli, AnAdapterOnTheBaseAnswersAsTheMergedModel) {
  const std::string train = "epochs=1 max_steps_per_epoch=20 optimizer.lr=1e-2";
  Outcome run = run_tiny("", "lora_finetune_single_device", "lora_single_device", train, out());
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const std::string epoch = out() + "/epoch_0";
  const std::string rows = write("rows.jsonl", {{{"instruction", "Sort the numbers from smallest to largest."}, {"input", "4, 3, 1"}},
                                                {{"instruction", "Reverse the list."}, {"input", "1, 2, 3, 4"}}});
  auto answers = [&](const std::string& flags) {
    Outcome r = quiet(kKtune + " generate --chat --max-new-tokens 8 --prompts " + rows + " --template alpaca " + flags);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return r.output;
  };
  const std::string merged = answers("--model " + epoch);
  const std::string adapted = answers("--model " + model() + " --adapter " + epoch);
  const std::string base = answers("--model " + model());
  EXPECT_EQ(adapted, merged);
  EXPECT_NE(adapted, base);

  Outcome only = run_tiny("", "lora_finetune_single_device", "lora_single_device", train + " save_adapter_weights_only=True",
                          out("adapter_only"));
  ASSERT_EQ(only.exit_code, 0) << only.output;
  EXPECT_FALSE(fs::exists(out("adapter_only") + "/epoch_0/model-00001-of-00001.safetensors"));
  EXPECT_EQ(answers("--model " + model() + " --adapter " + out("adapter_only") + "/epoch_0"), merged);
  // An adapter for another model is refused, naming the tensor.
  Outcome wrong = sh(generate("--adapter " + kSource + "/tests/model/fixtures/peft/lora --prompt hi"));
  EXPECT_NE(wrong.exit_code, 0);
  EXPECT_NE(wrong.output.find("adapter_model.safetensors"), std::string::npos) << wrong.output;
}

// Sampling (--temperature, --top-k, --top-p, --seed): a seed answers the same twice and another
// seed otherwise; --top-k 1 samples the greedy answer; bf16 weights (--dtype bf16) answer too;
// --no-repeat-ngram-size changes a greedy answer that repeats itself; --num-beams searches.
TEST_F(GenerateCli, SampledAnswersFollowTheirSeedAndTopKOneIsGreedy) {
  const std::string prompts = write("prompts.jsonl", {"Reverse the list.\n\n1, 2, 3", "Sort: 5, 1, 4"});
  auto answers = [&](const std::string& flags) {
    Outcome r = quiet(kKtune + " generate --model " + model() + " --chat --max-new-tokens 12 --prompts " + prompts + " " + flags);
    EXPECT_EQ(r.exit_code, 0) << flags << "\n" << r.output;
    return answers_of(r.output);
  };
  const auto greedy = answers("");
  ASSERT_EQ(greedy.size(), 2u);
  const auto seed5 = answers("--temperature 1.5 --seed 5");
  EXPECT_EQ(answers("--temperature 1.5 --seed 5"), seed5);
  EXPECT_NE(answers("--temperature 1.5 --seed 6"), seed5);
  EXPECT_NE(seed5, greedy);  // the tiny model's random weights give nearly flat logits
  EXPECT_EQ(answers("--temperature 1.5 --top-k 1 --seed 5"), greedy);
  EXPECT_EQ(answers("--temperature 0"), greedy);
  EXPECT_EQ(answers("--dtype bf16").size(), 2u);
  // A ban on repeated tokens (n-grams of 1: none of the prompt's or the answer's tokens again) takes
  // effect: the random weights' greedy answers repeat themselves.
  EXPECT_NE(answers("--no-repeat-ngram-size 1"), greedy);
  // Beam search answers every prompt (model/beam_search.h is checked against transformers); one beam
  // is the greedy answer.
  EXPECT_EQ(answers("--num-beams 3 --length-penalty 0.5 --early-stopping").size(), 2u);
  EXPECT_EQ(answers("--num-beams 1"), greedy);

  Outcome r = sh(generate("--prompt hi --top-k 5"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--temperature"), std::string::npos) << r.output;
  r = sh(generate("--prompt hi --temperature 1 --top-p 0"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("top_p"), std::string::npos) << r.output;
  r = sh(generate("--prompt hi --temperature -1"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("temperature"), std::string::npos) << r.output;
  r = sh(generate("--prompt hi --no-repeat-ngram-size -1"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--no-repeat-ngram-size"), std::string::npos) << r.output;
  r = sh(generate("--prompt hi --length-penalty 2"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--num-beams"), std::string::npos) << r.output;
  r = sh(generate("--prompt hi --num-beams 2 --temperature 0.5"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--temperature"), std::string::npos) << r.output;
  r = sh(generate("--prompt hi --dtype f16"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--dtype"), std::string::npos) << r.output;
}

TEST_F(GenerateCli, BadLinesAndFlagMixesAreRefusedNamingTheFileAndLine) {
  const std::string file = (dir_ / "bad.jsonl").string();
  std::ofstream(file) << "\"fine\"\n{not json\n";
  Outcome r = sh(generate("--prompts " + file));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find(file + ":2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("not JSON"), std::string::npos) << r.output;

  const std::string rows = write("rows.jsonl", {{{"instruction", "Add."}, {"input", "1 + 2"}}});
  r = sh(generate("--prompts " + rows));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find(rows + ":1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--template alpaca"), std::string::npos) << r.output;

  const std::string no_instruction = write("no_instruction.jsonl", {{{"input", "1 + 2"}}});
  r = sh(generate("--prompts " + no_instruction + " --template alpaca"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find(no_instruction + ":1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\"instruction\""), std::string::npos) << r.output;

  r = sh(generate("--prompts " + rows + " --template chatml"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("unknown template 'chatml'"), std::string::npos) << r.output;
  r = sh(generate("--prompt hi --template alpaca"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("goes with --prompts"), std::string::npos) << r.output;
  r = sh(generate("--prompt hi --dry-run"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--dry-run"), std::string::npos) << r.output;
  r = sh(generate("--prompt hi --prompts " + rows));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("exactly one of --prompt"), std::string::npos) << r.output;
  r = sh(generate("--prompts " + (dir_ / "missing.jsonl").string()));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("missing.jsonl"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace ktune
