// Generation: append a chosen next token (model/token_choice.h: greedy, or sampled with
// temperature, top-k, top-p, min-p; either after a repetition penalty and a ban on repeated n-grams
// over the prompt and the answer so far) until a stop token or a length limit, the way transformers' generate() does. Each prompt
// runs through the model once, then each new token alone against its key/value cache
// (model/kv_cache.h), so an answer costs about one forward of its own tokens. Several prompts are
// answered together: their prompts in one pass (one GEMM per projection over all their tokens,
// attention within each), then every unfinished answer's step in one pass, so that a step reads the
// weights once for all of them (decoding is bound by reading the weights). f32 activations: for
// looking at what a fine-tune learned (`ktune generate`), not serving.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "model/decoder.h"
#include "model/token_choice.h"

namespace ktune::model {

struct Generated {
  // Each prompt's new tokens only (the stop token that ended one is not included).
  std::vector<std::vector<int32_t>> answers;
  int64_t prompt_tokens = 0;
  double prompt_seconds = 0;  // the prompts' pass, up to each one's first new token
  int64_t steps = 0;          // the passes after those, each one token of every unfinished answer
  int64_t step_tokens = 0;    // the tokens those passes ran
  double step_seconds = 0;
};

// Answer s of a prompt draws with index s of choice.seed's stream, so an answer does not depend on
// which prompts it was answered with; nor, but for the float rounding of a batch's GEMMs, does a
// greedy one.
Generated generate(Decoder& decoder, const std::vector<std::vector<int32_t>>& prompts, int max_new_tokens,
                   const TokenChoice& choice, const std::function<bool(int32_t)>& is_stop);

// One prompt's answer.
std::vector<int32_t> generate(Decoder& decoder, const std::vector<int32_t>& prompt, int max_new_tokens,
                              const TokenChoice& choice, const std::function<bool(int32_t)>& is_stop);

}  // namespace ktune::model
