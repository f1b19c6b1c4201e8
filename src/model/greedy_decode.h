// Greedy decoding: append the most likely next token until a stop token or a length limit, the
// way transformers' generate(do_sample=False) does (ties go to the lowest id, as torch.argmax).
// It recomputes the whole prefix for every token (no KV cache): for a quick look at what a small
// fine-tune learned (`ktune generate`, the quickstart), not for serving.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "model/decoder.h"

namespace ktune::model {

// The new tokens only (the stop token that ended it is not included).
std::vector<int32_t> greedy_decode(Decoder& decoder, const std::vector<int32_t>& prompt, int max_new_tokens,
                                   const std::function<bool(int32_t)>& is_stop);

}  // namespace ktune::model
