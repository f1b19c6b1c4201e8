// `ktune generate --model DIR [--adapter DIR] --prompt TEXT [--max-new-tokens N] [--chat]`:
// greedy decoding with a model directory ktune (or HF) wrote, for a quick look at what a
// fine-tune learned. It recomputes the whole prefix each token (no KV cache): meant for small
// models and short answers, not serving.
#include <cstdio>
#include <filesystem>

#include "cli/command_table.h"
#include "cli/flag_args.h"
#include "core/error.h"
#include "model/decoder.h"
#include "text/chat_format.h"
#include "text/tokenizer.h"

namespace fs = std::filesystem;

namespace ktune::cli {

namespace {

std::string find_tokenizer(const fs::path& dir) {
  for (const char* name : {"tokenizer.json", "original/tokenizer.model", "tokenizer.model"})
    if (fs::exists(dir / name)) return (dir / name).string();
  throw Error(dir.string(), "no tokenizer.json or tokenizer.model in the model directory (pass --tokenizer)");
}

}  // namespace

int cmd_generate(const Args& args) {
  std::string model_dir, prompt, tokenizer_path;
  int max_new_tokens = 32;
  bool chat = false;
  FlagArgs a("ktune generate", args);
  while (a.next()) {
    if (a.is("--model")) model_dir = a.value();
    else if (a.is("--prompt")) prompt = a.value();
    else if (a.is("--tokenizer")) tokenizer_path = a.value();
    else if (a.is("--max-new-tokens")) max_new_tokens = int(a.int_value(0, 1 << 20));
    else if (a.is("--chat")) a.expect_no_value(), chat = true;
    else a.unknown("usage: ktune generate --model DIR --prompt TEXT [--max-new-tokens N] [--chat] [--tokenizer FILE]");
  }
  if (model_dir.empty()) throw Error("generate", "--model DIR is required");
  auto decoder = model::Decoder::from_pretrained(model_dir);
  TokenizerOptions options;
  options.path = tokenizer_path.empty() ? find_tokenizer(model_dir) : tokenizer_path;
  auto tokenizer = load_tokenizer(options);

  std::vector<int32_t> ids;
  if (chat) {
    ChatFormat format(*tokenizer, detect_chat_format(*tokenizer));
    ids = format.tokenize({Message::text("user", prompt), Message::text("assistant", "")}, false).tokens;
  } else {
    ids = tokenizer->encode(prompt, /*add_bos=*/true, false);
  }
  const size_t prompt_length = ids.size();
  const int64_t V = decoder->config().vocab_size;
  for (int step = 0; step < max_new_tokens; ++step) {
    model::Batch batch{ids.data(), nullptr, nullptr, nullptr, 1, int64_t(ids.size())};
    Tensor logits = decoder->forward_logits(batch);  // (1, T, V)
    const float* last = logits.f32() + (int64_t(ids.size()) - 1) * V;
    int32_t next = 0;
    for (int32_t v = 1; v < V; ++v)
      if (last[v] > last[next]) next = v;
    if (tokenizer->is_special(next) && (next == tokenizer->eos_id() || tokenizer->id_to_token(next) == "<|eot_id|>" ||
                                        tokenizer->id_to_token(next) == "<|im_end|>"))
      break;
    ids.push_back(next);
  }
  std::vector<int32_t> answer(ids.begin() + long(prompt_length), ids.end());
  std::printf("%s\n", tokenizer->decode(answer, /*skip_special=*/true).c_str());
  return 0;
}

}  // namespace ktune::cli
