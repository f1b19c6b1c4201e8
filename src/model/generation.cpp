#include "model/generation.h"

#include <chrono>

#include "core/error.h"
#include "model/kv_cache.h"

namespace ktune::model {

Generated generate(Decoder& decoder, const std::vector<int32_t>& prompt, int max_new_tokens, const TokenChoice& choice,
                   const std::function<bool(int32_t)>& is_stop) {
  if (prompt.empty()) throw Error("generate", "the prompt has no tokens");
  check_token_choice(choice);
  Generated out;
  if (max_new_tokens <= 0) return out;
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const int64_t V = decoder.config().vocab_size;
  // The last token chosen is never fed back: room for the prompt and all but one new token.
  KvCache cache(decoder.config(), int64_t(prompt.size()) + max_new_tokens - 1);
  std::vector<float> logits(static_cast<size_t>(V));  // (V) of the last token fed
  decoder.forward_cached(prompt.data(), int64_t(prompt.size()), cache, logits.data());
  const auto prompt_done = Clock::now();
  for (int step = 0; step < max_new_tokens; ++step) {
    const int32_t next = choose_token(logits.data(), V, choice, uint64_t(step));
    if (is_stop(next)) break;
    out.tokens.push_back(next);
    if (step + 1 < max_new_tokens) decoder.forward_cached(&next, 1, cache, logits.data());
  }
  out.prompt_seconds = std::chrono::duration<double>(prompt_done - start).count();
  out.answer_seconds = std::chrono::duration<double>(Clock::now() - prompt_done).count();
  return out;
}

}  // namespace ktune::model
