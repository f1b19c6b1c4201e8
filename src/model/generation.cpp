#include "model/generation.h"

#include <chrono>
#include <cstring>
#include <string>

#include "core/error.h"
#include "model/kv_cache.h"

namespace ktune::model {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

}  // namespace

Generated generate(Decoder& decoder, const std::vector<std::vector<int32_t>>& prompts, int max_new_tokens,
                   const TokenChoice& choice, const std::function<bool(int32_t)>& is_stop) {
  for (size_t i = 0; i < prompts.size(); ++i)
    if (prompts[i].empty()) throw Error("generate", "prompt " + std::to_string(i) + " has no tokens");
  check_token_choice(choice);
  const int64_t S = int64_t(prompts.size()), V = decoder.config().vocab_size;
  Generated out;
  out.answers.resize(size_t(S));
  if (max_new_tokens <= 0 || S == 0) return out;

  // The prompts in one pass, each with its cache (room for the prompt and all but the last new
  // token, which is never fed back): the logits (V) of each one's last token, row i of (S, V).
  std::vector<KvCache> caches;
  caches.reserve(size_t(S));  // CachedSequence points into it
  std::vector<CachedSequence> sequences;
  std::vector<int32_t> prompt_tokens;
  for (const auto& prompt : prompts) {
    caches.emplace_back(decoder.config(), int64_t(prompt.size()) + max_new_tokens - 1);
    sequences.push_back({&caches.back(), int64_t(prompt.size())});
    prompt_tokens.insert(prompt_tokens.end(), prompt.begin(), prompt.end());
  }
  out.prompt_tokens = int64_t(prompt_tokens.size());
  std::vector<float> logits(static_cast<size_t>(S * V));
  const auto prompts_start = Clock::now();
  decoder.forward_cached(prompt_tokens.data(), sequences, logits.data());
  out.prompt_seconds = seconds_since(prompts_start);

  // Then a step at a time: each unfinished answer chooses its next token from its row of logits;
  // those that go on are fed together, their new logits laid back into their rows.
  std::vector<int64_t> unfinished(static_cast<size_t>(S));
  for (int64_t i = 0; i < S; ++i) unfinished[size_t(i)] = i;
  std::vector<float> step_logits;  // (B, V) of a step's B sequences
  const auto steps_start = Clock::now();
  while (!unfinished.empty()) {
    std::vector<int64_t> fed;
    std::vector<int32_t> tokens;
    std::vector<CachedSequence> sequences;
    for (int64_t i : unfinished) {
      std::vector<int32_t>& answer = out.answers[size_t(i)];
      float* row = logits.data() + i * V;
      apply_context_penalties(row, V, prompts[size_t(i)], answer, choice);
      const int32_t next = choose_token(row, V, choice, uint64_t(answer.size()));
      if (is_stop(next)) continue;
      answer.push_back(next);
      if (int64_t(answer.size()) == max_new_tokens) continue;
      fed.push_back(i);
      tokens.push_back(next);
      sequences.push_back({&caches[size_t(i)], 1});
    }
    unfinished = fed;
    if (fed.empty()) break;
    step_logits.resize(fed.size() * size_t(V));
    decoder.forward_cached(tokens.data(), sequences, step_logits.data());
    for (size_t b = 0; b < fed.size(); ++b)
      std::memcpy(logits.data() + fed[b] * V, step_logits.data() + b * size_t(V), sizeof(float) * size_t(V));
    ++out.steps;
    out.step_tokens += int64_t(fed.size());
  }
  out.step_seconds = seconds_since(steps_start);
  return out;
}

std::vector<int32_t> generate(Decoder& decoder, const std::vector<int32_t>& prompt, int max_new_tokens,
                              const TokenChoice& choice, const std::function<bool(int32_t)>& is_stop) {
  return std::move(generate(decoder, std::vector<std::vector<int32_t>>{prompt}, max_new_tokens, choice, is_stop)
                       .answers.front());
}

}  // namespace ktune::model
