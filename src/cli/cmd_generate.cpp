// `ktune generate --model DIR [--adapter DIR] (--prompt TEXT | --prompts FILE [--template alpaca]
//                 [--batch-size N] [--dry-run]) [--chat] [--max-new-tokens N] [--tokenizer FILE]
//                 [--dtype fp32|bf16] [--temperature T [--top-k K] [--top-p P] [--min-p M] [--seed S]]
//                 [--repetition-penalty R] [--no-repeat-ngram-size N] [--num-beams N [--length-penalty L]
//                 [--early-stopping]]`:
// generation with a model directory ktune (or HF) wrote, for a quick look at what a fine-tune
// learned (model/generation.h: the prompt once, then a token a step against a KV cache).
//   --adapter DIR   a PEFT adapter directory (adapter_config.json + adapter_model.safetensors: a
//                   LoRA run's epoch_N/, or PEFT's own) put on the --model base as PEFT puts it
//                   (model/adapters/peft_adapter_dir.h); for runs saved with
//                   save_adapter_weights_only, which write no merged model.
//   --prompt TEXT   one prompt; prints the answer as text.
//   --prompts FILE  JSON lines, one prompt a line (a JSON string), the model loaded once; prints
//                   one JSON string a line, the answers in order ("-" reads stdin). --batch-size N
//                   (8) lines are answered together (their decoding steps run as one batch), and
//                   printed when all N are answered: a writer that waits for each answer before
//                   its next line wants --batch-size 1.
//   --template alpaca  with --prompts: each line is a dataset row, an object with "instruction"
//                   and "input" (absent, null or empty: none), made into the prompt torchtune's
//                   alpaca_dataset trains on (text/prompt_template.h's alpaca_prompt, the very
//                   function the recipes use), so held-out rows are asked as training asked.
//   --dry-run       with --prompts: prints each line's prompt text (a JSON string a line) instead
//                   of answering it, to see what the model will be asked.
//   --chat          wraps the prompt as the user turn of the tokenizer's chat format and opens
//                   the assistant's, as the recipes tokenise a conversation; without it the
//                   prompt is encoded as plain text after BOS.
//   --chat-template wraps it with the model's own Jinja chat template instead (tokenizer_config.json's
//                   chat_template, or chat_template.jinja), with the generation prompt: the text
//                   transformers' apply_chat_template(add_generation_prompt=True) and vLLM's chat
//                   completions give, as a model trained through HuggingFaceModelTokenizer saw it.
//   --dtype         how the weights are kept: fp32 (the default) or bf16 (half the memory,
//                   multiplied as bf16 with f32 accumulation, as bf16 training does).
//   --temperature T 0 (the default) answers greedily; above 0 samples from softmax(logits / T),
//                   cut to the --top-k most likely (0: all) and then to the most likely whose
//                   probability reaches --top-p (1: all), then to those at least --min-p times
//                   as likely as the most likely (0: all), with draws from --seed (0): the same
//                   seed gives the same answer to the same prompt (model/token_choice.h).
//   --repetition-penalty R  above 1 makes the tokens of the prompt and the answer so far less
//                   likely (HF's repetition_penalty: a positive logit divided by R, a negative one
//                   multiplied), greedy or sampled; 1 (the default): none.
//   --no-repeat-ngram-size N  no N tokens in a row occur twice in the prompt and the answer: a
//                   token that would repeat one is never chosen (HF's no_repeat_ngram_size); 0
//                   (the default): none.
//   --num-beams N   beam search with N beams (model/beam_search.h, HF's generate(num_beams=N)): the
//                   answer is the best of N hypotheses by log-probability sum over length^L
//                   (--length-penalty L, default 1); --early-stopping stops once N have finished.
//                   Greedy only (no --temperature); each prompt's beams run as one batch.
// Decoding stops at the tokenizer's EOS, an end-of-turn token (<|eot_id|>, <|im_end|>,
// <end_of_turn>) or an id of the model's generation_config.json eos_token_id (else config.json's).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>

#include <nlohmann/json.hpp>

#include "cli/command_table.h"
#include "cli/flag_args.h"
#include "core/error.h"
#include "core/log.h"
#include "model/adapters/peft_adapter_dir.h"
#include "model/beam_search.h"
#include "model/decoder.h"
#include "model/generation.h"
#include "text/chat_format.h"
#include "text/tokenizer_formats.h"
#include "text/prompt_template.h"
#include "text/tokenizer.h"

namespace fs = std::filesystem;

namespace ktune::cli {

namespace {

constexpr const char* kUsage =
    "usage: ktune generate --model DIR [--adapter DIR] (--prompt TEXT | --prompts FILE [--template alpaca] [--batch-size N] [--dry-run]) "
    "[--chat | --chat-template [--tools FILE]] [--max-new-tokens N] [--tokenizer FILE] [--dtype fp32|bf16] "
    "[--temperature T [--top-k K] [--top-p P] [--min-p M] [--seed S]] [--repetition-penalty R] [--no-repeat-ngram-size N] "
    "[--num-beams N [--length-penalty L] [--early-stopping]]";

constexpr const char* kHelp =
    "\n"
    "Answers prompts with an HF model directory (and a PEFT adapter on it), greedily unless\n"
    "--temperature is above 0. The answers go to stdout: the text for --prompt, one JSON string a line\n"
    "for --prompts.\n"
    "\n"
    "  --model DIR              config.json, *.safetensors and the tokenizer (tokenizer.json or tokenizer.model)\n"
    "  --adapter DIR            a PEFT adapter directory (adapter_config.json, adapter_model.safetensors)\n"
    "  --prompt TEXT            one prompt, as it is\n"
    "  --prompts FILE           JSON lines (\"-\": stdin), each a JSON string (the prompt), or under\n"
    "                           --template alpaca an object with \"instruction\" and optionally \"input\"\n"
    "  --template alpaca        ask each row as alpaca_dataset asks it in training\n"
    "  --batch-size N           prompts answered together (default 8)\n"
    "  --dry-run                print the prompts --prompts makes, load no model\n"
    "  --chat                   ask the prompt as the user turn of the tokenizer's chat format, the answer\n"
    "                           as the assistant's\n"
    "  --chat-template          ask it through the model's own chat template (tokenizer_config.json's\n"
    "                           chat_template or chat_template.jinja), as transformers and vLLM do\n"
    "  --tools FILE             with --chat-template: offer these tools (a JSON list of tool schemas), as\n"
    "                           apply_chat_template(tools=...) and a chat completion's \"tools\" do\n"
    "  --max-new-tokens N       at most N tokens an answer (default 32); the tokenizer's EOS, an end-of-turn\n"
    "                           token or an eos_token_id of the model's generation_config.json ends it earlier\n"
    "  --tokenizer FILE         a tokenizer other than the model directory's\n"
    "  --dtype fp32|bf16        the weights' storage (default fp32)\n"
    "  --temperature T          sample at temperature T (default 0: greedy)\n"
    "  --top-k K, --top-p P, --min-p M, --seed S\n"
    "                           keep the K likeliest tokens / the likeliest whose probability reaches P / those at\n"
    "                           least M times the likeliest's probability; S seeds the draws (as HF generate)\n"
    "  --repetition-penalty R   the tokens already in the prompt or the answer: positive logits divided by R,\n"
    "                           negative ones multiplied by it (HF's repetition_penalty)\n"
    "  --no-repeat-ngram-size N no N tokens in a row twice in the prompt and the answer (HF's\n"
    "                           no_repeat_ngram_size)\n"
    "  --num-beams N            beam search: the best of N hypotheses (HF's num_beams; greedy, no --temperature)\n"
    "  --length-penalty L       a finished hypothesis scores its log-probability sum / length^L (default 1)\n"
    "  --early-stopping         stop the search once N hypotheses have finished (HF's early_stopping=True)\n";

std::string find_tokenizer(const fs::path& dir) {
  for (const char* name : {"tokenizer.json", "original/tokenizer.model", "tokenizer.model"})
    if (fs::exists(dir / name)) return (dir / name).string();
  throw Error(dir.string(), "no tokenizer.json or tokenizer.model in the model directory (pass --tokenizer)");
}

bool ends_turn(const Tokenizer& tokenizer, int32_t id) {
  if (!tokenizer.is_special(id)) return false;
  if (tokenizer.eos_id() && id == *tokenizer.eos_id()) return true;
  const std::string token = tokenizer.id_to_token(id);
  return token == "<|eot_id|>" || token == "<|im_end|>" || token == "<end_of_turn>";
}

// The model's own end-of-answer ids, as HF's generate() stops at them: generation_config.json's
// eos_token_id (an id or a list), else config.json's (read with the model: `from_config`).
std::vector<int32_t> model_eos_ids(const fs::path& model_dir, const std::vector<int32_t>& from_config) {
  const fs::path path = model_dir / "generation_config.json";
  if (!fs::exists(path)) return from_config;
  std::ifstream in(path);
  const nlohmann::json config = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object()) throw Error(path.string(), "not a JSON object");
  const auto it = config.find("eos_token_id");
  if (it == config.end() || it->is_null()) return from_config;
  std::vector<int32_t> ids;
  for (const nlohmann::json& id : it->is_array() ? *it : nlohmann::json::array({*it})) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
      throw Error(path.string() + ": eos_token_id", "expected a token id or a list of them, got " + it->dump());
    ids.push_back(int32_t(id.get<int64_t>()));
  }
  return ids;
}

// A prompt from one line of --prompts: a JSON string, or under --template alpaca a row.
std::string prompt_of_line(const std::string& line, bool alpaca, const std::string& place) {
  nlohmann::json value;
  try {
    value = nlohmann::json::parse(line);
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(place, std::string("not JSON: ") + e.what());
  }
  if (!alpaca) {
    if (!value.is_string()) throw Error(place, "expected a JSON string (the prompt); rows need --template alpaca");
    return value.get<std::string>();
  }
  if (!value.is_object()) throw Error(place, "expected a JSON object with \"instruction\" and \"input\"");
  auto text = [&](const char* key, bool required) -> std::string {
    auto it = value.find(key);
    if (it == value.end() || it->is_null()) {
      if (required) throw Error(place, std::string("the row has no \"") + key + "\"");
      return "";
    }
    if (!it->is_string()) throw Error(place, std::string("\"") + key + "\" is not a string");
    return it->get<std::string>();
  };
  const std::string instruction = text("instruction", true);
  return alpaca_prompt(instruction, text("input", false));
}

// --dtype: the names the recipes' `dtype` takes.
DType storage_of(const std::string& name) {
  if (name == "fp32" || name == "float32") return DType::F32;
  if (name == "bf16" || name == "bfloat16") return DType::BF16;
  throw Error("--dtype", "unknown dtype '" + name + "'; known: fp32, bf16");
}

// How a prompt is asked: as plain text after BOS, as the user turn of the tokenizer's family chat
// format (--chat), or through the model's own chat template (--chat-template).
enum class ChatMode { kNone, kFormat, kTemplate };

class Generator {
 public:
  Generator(const std::string& model_dir, const std::string& adapter_dir, const std::string& tokenizer_path, ChatMode chat,
            nlohmann::ordered_json tools, DType storage, int max_new_tokens, const model::TokenChoice& choice,
            const model::BeamOptions& beams)
      : decoder_(model::Decoder::from_pretrained(model_dir, model::LoadOptions{storage})),
        tools_(std::move(tools)),
        max_new_tokens_(max_new_tokens),
        choice_(choice),
        beams_(beams) {
    if (!adapter_dir.empty()) model::load_peft_adapter(*decoder_, adapter_dir);
    // Forward only: one layer's activations are planned instead of every layer's (with no backward,
    // nothing is ever recomputed), so a long prompt takes little memory.
    decoder_->set_activation_checkpointing(true);
    TokenizerOptions options;
    options.path = tokenizer_path.empty() ? find_tokenizer(model_dir) : tokenizer_path;
    options.config_path = tokenizer_config_beside(options.path);  // as AutoTokenizer reads it
    tokenizer_ = load_tokenizer(options);
    if (chat == ChatMode::kFormat) chat_format_ = std::make_unique<ChatFormat>(*tokenizer_, detect_chat_format(*tokenizer_));
    if (chat == ChatMode::kTemplate) chat_format_ = template_format(*tokenizer_, options);
    for (int32_t id = 0; id < tokenizer_->vocab_size(); ++id)
      if (ends_turn(*tokenizer_, id)) stop_ids_.push_back(id);
    // And every id the model's generation config ends an answer with (Llama 3.1 Instruct's
    // <|eom_id|>, a custom list), as HF does; their count sets beam search's candidates as HF's.
    const std::vector<int32_t> eos = model_eos_ids(model_dir, decoder_->config().eos_token_ids);
    for (int32_t id : eos)
      if (std::find(stop_ids_.begin(), stop_ids_.end(), id) == stop_ids_.end()) stop_ids_.push_back(id);
    beams_.eos_count = int(eos.size());
  }

  // --chat-template: the model's chat template, from the tokenizer_config.json beside the tokenizer.
  static std::unique_ptr<ChatFormat> template_format(const Tokenizer& tokenizer, const TokenizerOptions& options) {
    if (options.config_path.empty())
      throw Error("--chat-template", "there is no tokenizer_config.json beside " + options.path + " to read the chat template from");
    std::optional<HfChatTemplate> chat = HfChatTemplate::from_tokenizer_config(options.config_path);
    if (!chat)
      throw Error("--chat-template", options.config_path + " has no chat_template (nor is a chat_template.jinja beside it); "
                                     "--chat asks with the tokenizer's family format instead");
    return std::make_unique<ChatFormat>(tokenizer, std::move(*chat), tokenizer.eos_id());
  }

  // The prompts answered together (model/generation.h), in order.
  std::vector<std::string> answer(const std::vector<std::string>& prompts) {
    std::vector<std::vector<int32_t>> ids;
    for (const std::string& prompt : prompts) {
      if (chat_format_)
        ids.push_back(chat_format_->tokenize({Message::text("user", prompt), Message::text("assistant", "")}, false, tools_).tokens);
      else
        ids.push_back(tokenizer_->encode(prompt, /*add_bos=*/true, false));
    }
    const Tokenizer& tokenizer = *tokenizer_;
    if (beams_.num_beams > 1) return answer_by_beams(ids);
    const model::Generated generated =
        model::generate(*decoder_, ids, max_new_tokens_, choice_, [&](int32_t id) {
          return std::find(stop_ids_.begin(), stop_ids_.end(), id) != stop_ids_.end();
        });
    log_rates(generated);
    std::vector<std::string> texts;
    for (const auto& answer : generated.answers) texts.push_back(tokenizer.decode(answer, /*skip_special=*/true));
    return texts;
  }

  // Each prompt by beam search, its beams one batch.
  std::vector<std::string> answer_by_beams(const std::vector<std::vector<int32_t>>& ids) {
    std::vector<std::string> texts;
    for (const std::vector<int32_t>& prompt : ids) {
      const model::BeamAnswer best = model::beam_search(*decoder_, prompt, max_new_tokens_, beams_, choice_, stop_ids_);
      log_info("generate: " + std::to_string(beams_.num_beams) + " beams; the best answer has " +
               std::to_string(best.tokens.size()) + " tokens, score " + std::to_string(best.score));
      texts.push_back(tokenizer_->decode(best.tokens, /*skip_special=*/true));
    }
    return texts;
  }

  static void log_rates(const model::Generated& g) {
    int64_t answer_tokens = 0;
    for (const auto& answer : g.answers) answer_tokens += int64_t(answer.size());
    char line[256];
    std::snprintf(line, sizeof line,
                  "generate: %zu prompt(s), %lld tokens in %.3f s (%.1f tokens/s); answers %lld tokens, the first of "
                  "each with its prompt, then %lld step(s) of %lld tokens in %.3f s (%.1f tokens/s)",
                  g.answers.size(), (long long)g.prompt_tokens, g.prompt_seconds,
                  double(g.prompt_tokens) / std::max(g.prompt_seconds, 1e-9), (long long)answer_tokens,
                  (long long)g.steps, (long long)g.step_tokens, g.step_seconds,
                  double(g.step_tokens) / std::max(g.step_seconds, 1e-9));
    log_info(line);
  }

 private:
  std::unique_ptr<model::Decoder> decoder_;
  nlohmann::ordered_json tools_;  // --tools: offered through the chat template (null: none)
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<ChatFormat> chat_format_;  // --chat: the tokenizer's format (it refers to tokenizer_)
  int max_new_tokens_;
  model::TokenChoice choice_;
  model::BeamOptions beams_;
  std::vector<int32_t> stop_ids_;  // the tokens that end an answer: ends_turn's and the model's eos ids
};

// One JSON string a line: the answer to each line's prompt, or without a generator (--dry-run)
// the prompt itself. Lines are answered batch_size at a time, each batch printed as it is done.
void answer_lines(Generator* generator, std::istream& in, const std::string& name, bool alpaca, int batch_size) {
  std::vector<std::string> prompts;
  auto flush = [&] {
    const std::vector<std::string> lines = generator ? generator->answer(prompts) : prompts;
    for (const std::string& line : lines) std::printf("%s\n", nlohmann::json(line).dump().c_str());
    std::fflush(stdout);
    prompts.clear();
  };
  std::string line;
  for (size_t line_no = 1; std::getline(in, line); ++line_no) {
    prompts.push_back(prompt_of_line(line, alpaca, name + ":" + std::to_string(line_no)));
    if (int(prompts.size()) == batch_size) flush();
  }
  if (!prompts.empty()) flush();
}

}  // namespace

int cmd_generate(const Args& args) {
  std::string model_dir, adapter_dir, prompt, prompts_path, tokenizer_path, template_name;
  bool has_prompt = false;
  int max_new_tokens = 32;
  int batch_size = 8;
  ChatMode chat = ChatMode::kNone;
  std::string tools_path;
  bool dry_run = false, sampling_option = false, beam_option = false;
  model::TokenChoice choice;
  model::BeamOptions beams;
  DType storage = DType::F32;
  FlagArgs a("ktune generate", args);
  while (a.next()) {
    if (a.help()) {
      std::printf("%s\n%s", kUsage, kHelp);
      return 0;
    }
    if (a.is("--model")) model_dir = a.value();
    else if (a.is("--adapter")) adapter_dir = a.value();
    else if (a.is("--prompt")) prompt = a.value(), has_prompt = true;
    else if (a.is("--prompts")) prompts_path = a.value();
    else if (a.is("--template")) template_name = a.value();
    else if (a.is("--tokenizer")) tokenizer_path = a.value();
    else if (a.is("--max-new-tokens")) max_new_tokens = int(a.int_value(0, 1 << 20));
    else if (a.is("--batch-size")) batch_size = int(a.int_value(1, 1 << 16));
    else if (a.is("--temperature")) choice.temperature = float(a.number_value());
    else if (a.is("--top-k")) choice.top_k = a.int_value(0, 1LL << 40), sampling_option = true;
    else if (a.is("--top-p")) choice.top_p = float(a.number_value()), sampling_option = true;
    else if (a.is("--min-p")) choice.min_p = float(a.number_value()), sampling_option = true;
    else if (a.is("--repetition-penalty")) choice.repetition_penalty = float(a.number_value());
    else if (a.is("--no-repeat-ngram-size")) choice.no_repeat_ngram_size = a.int_value(0, 1 << 20);
    else if (a.is("--num-beams")) beams.num_beams = int(a.int_value(1, 1 << 10));
    else if (a.is("--length-penalty")) beams.length_penalty = float(a.number_value()), beam_option = true;
    else if (a.is("--early-stopping")) a.expect_no_value(), beams.early_stopping = true, beam_option = true;
    else if (a.is("--seed")) choice.seed = uint64_t(a.int_value(0, std::numeric_limits<int64_t>::max())), sampling_option = true;
    else if (a.is("--dtype")) storage = storage_of(a.value());
    else if (a.is("--chat") || a.is("--chat-template")) {
      a.expect_no_value();
      const ChatMode mode = a.is("--chat") ? ChatMode::kFormat : ChatMode::kTemplate;
      if (chat != ChatMode::kNone && chat != mode)
        throw Error("generate", "--chat and --chat-template are two ways to ask: give one");
      chat = mode;
    }
    else if (a.is("--dry-run")) a.expect_no_value(), dry_run = true;
    else if (a.is("--tools")) tools_path = a.value();
    else a.unknown(kUsage);
  }
  if (model_dir.empty() && !dry_run) throw Error("generate", std::string("--model DIR is required; ") + kUsage);
  if (has_prompt == !prompts_path.empty())
    throw Error("generate", std::string("give exactly one of --prompt TEXT and --prompts FILE; ") + kUsage);
  if (!template_name.empty() && template_name != "alpaca")
    throw Error("--template", "unknown template '" + template_name + "'; the one known is alpaca");
  if (!template_name.empty() && has_prompt)
    throw Error("--template", "goes with --prompts FILE (rows); --prompt takes the prompt's text as it is");
  if (dry_run && has_prompt) throw Error("--dry-run", "goes with --prompts FILE; --prompt's text is the prompt");
  model::check_token_choice(choice);
  if (sampling_option && choice.temperature == 0)
    throw Error("generate", "--top-k, --top-p, --min-p and --seed shape sampling: give --temperature above 0 with them "
                            "(without one the answer is greedy)");
  if (beam_option && beams.num_beams == 1)
    throw Error("generate", "--length-penalty and --early-stopping shape a beam search: give --num-beams above 1 with them");
  if (beams.num_beams > 1 && choice.temperature != 0)
    throw Error("--num-beams", "searches greedily: it does not go with --temperature (sampled beams are not built)");
  if (!std::isfinite(beams.length_penalty))
    throw Error("--length-penalty", "must be a finite number, not " + std::to_string(beams.length_penalty));

  nlohmann::ordered_json tools;  // their keys in the file's order, as Python's json.load keeps them
  if (!tools_path.empty()) {
    if (chat != ChatMode::kTemplate)
      throw Error("--tools", "offers tools through the model's own chat template: give --chat-template with it");
    try {
      tools = nlohmann::ordered_json::parse(text::read_file_bytes(tools_path));
    } catch (const nlohmann::json::parse_error& e) {
      throw Error(tools_path, std::string("not valid JSON: ") + e.what());
    }
    if (!tools.is_array())
      throw Error(tools_path, std::string("holds a JSON ") + tools.type_name() + "; --tools takes a list of tool schemas");
  }
  std::ifstream file;
  if (!prompts_path.empty() && prompts_path != "-") {
    file.open(prompts_path);
    if (!file) throw Error(prompts_path, "cannot open the prompts file");
  }
  std::unique_ptr<Generator> generator;
  if (!dry_run)
    generator = std::make_unique<Generator>(model_dir, adapter_dir, tokenizer_path, chat, std::move(tools), storage,
                                            max_new_tokens, choice, beams);
  if (has_prompt) {
    std::printf("%s\n", generator->answer({prompt}).front().c_str());
    return 0;
  }
  if (prompts_path == "-") answer_lines(generator.get(), std::cin, "stdin", !template_name.empty(), batch_size);
  else answer_lines(generator.get(), file, prompts_path, !template_name.empty(), batch_size);
  return 0;
}

}  // namespace ktune::cli
