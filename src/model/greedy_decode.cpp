#include "model/greedy_decode.h"

#include "core/error.h"

namespace ktune::model {

namespace {

// The id of the largest of V logits, the lowest id among equals.
int32_t argmax(const float* logits, int64_t V) {
  int32_t best = 0;
  for (int32_t v = 1; v < V; ++v)
    if (logits[v] > logits[best]) best = v;
  return best;
}

}  // namespace

std::vector<int32_t> greedy_decode(Decoder& decoder, const std::vector<int32_t>& prompt, int max_new_tokens,
                                   const std::function<bool(int32_t)>& is_stop) {
  if (prompt.empty()) throw Error("generate", "the prompt has no tokens");
  const int64_t V = decoder.config().vocab_size;
  std::vector<int32_t> ids = prompt;
  for (int step = 0; step < max_new_tokens; ++step) {
    const int64_t T = int64_t(ids.size());
    Batch batch{ids.data(), nullptr, nullptr, nullptr, 1, T};
    Tensor logits = decoder.forward_logits(batch);  // (1, T, V)
    const int32_t next = argmax(logits.f32() + (T - 1) * V, V);
    if (is_stop(next)) break;
    ids.push_back(next);
  }
  return std::vector<int32_t>(ids.begin() + long(prompt.size()), ids.end());
}

}  // namespace ktune::model
