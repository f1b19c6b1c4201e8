// What a save copies besides the weights must load where the checkpoint goes: every JSON file the
// checkpoint directory holds (config, tokenizer, generation config, ...) is copied into each
// epoch_N / step_N, where transformers reads it. A damaged one is refused before training starts,
// naming the file and what is wrong, instead of turning up in every output transformers cannot open.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace ktune::train {

// `files`: paths relative to `dir` (the non-weight files a save copies). Each *.json must parse;
// tokenizer_config.json must hold what AutoTokenizer reads as it reads it: special tokens (bos_token,
// eos_token, unk_token, pad_token, ...) as a string, null or {"content": string}, and when a
// tokenizer.json stands beside it, in that tokenizer's vocabulary or added tokens; chat_template as
// a string or a list of {"name", "template"} strings. Throws Error naming the file and key.
void check_copied_files(const std::filesystem::path& dir, const std::vector<std::filesystem::path>& files);

}  // namespace ktune::train
