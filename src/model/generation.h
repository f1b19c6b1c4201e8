// Generation: append a chosen next token (model/token_choice.h: greedy, or sampled with
// temperature, top-k, top-p) until a stop token or a length limit, the way transformers'
// generate() does. The prompt runs through the model once, then each new token alone against a
// key/value cache (model/kv_cache.h), so an answer costs about one forward of its own tokens.
// One sequence at a time, f32 activations: for looking at what a fine-tune learned
// (`ktune generate`), not serving.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "model/decoder.h"
#include "model/token_choice.h"

namespace ktune::model {

struct Generated {
  std::vector<int32_t> tokens;  // the new tokens only (the stop token that ended it is not included)
  double prompt_seconds = 0;    // running the prompt through the model, to the first token's logits
  double answer_seconds = 0;    // the rest: a step per new token after the first
};

// Step s draws with index s of choice.seed's stream, so a prompt's answer does not depend on what
// was generated before it.
Generated generate(Decoder& decoder, const std::vector<int32_t>& prompt, int max_new_tokens, const TokenChoice& choice,
                   const std::function<bool(int32_t)>& is_stop);

}  // namespace ktune::model
