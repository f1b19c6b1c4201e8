// Beam search, as transformers' generate(num_beams=N, do_sample=False) does it (its _beam_search):
// a prompt's answer is the best of N hypotheses grown a token a step. Each step, every running beam's
// next-token log-probabilities (log_softmax of its logits, then the repetition penalty and the
// n-gram ban over the prompt and that beam's answer, as HF's processors run on log-probabilities
// here) are added to the beam's sum; the best K = max(2, 1 + stop ids) * N continuations of all the
// beams are taken. Those that end (a stop token, or the length limit) among the first N of them are
// scored sum / length^length_penalty (length: the answer's tokens, the stop included) and kept if
// they rank among the N best finished so far; the N best that do not end run on. The search stops
// when every continuation ends, when (early_stopping) N beams have finished, or when no running
// beam can beat the worst of N finished ones: its sum over its length so far (HF's heuristic for
// early_stopping False) is not better. The answer is the best finished beam's tokens, without the
// stop token it ended on. Each beam keeps its own key/value cache, copied from its parent's when
// beams are chosen. For looking at a fine-tune's answers (`ktune generate --num-beams N`): one
// prompt at a time, its N beams run as one batch.
#pragma once

#include <cstdint>
#include <vector>

#include "model/decoder.h"
#include "model/token_choice.h"

namespace ktune::model {

struct BeamOptions {
  int num_beams = 1;            // the hypotheses kept (1: as greedy decoding)
  float length_penalty = 1.0f;  // a finished beam's score: its log-probability sum / length^length_penalty
  bool early_stopping = false;  // stop once num_beams beams have finished (false: HF's heuristic above)
  // HF's candidates a step, K = max(2, 1 + eos ids) x num_beams, count the model's eos_token_id list
  // (its generation_config.json's); 0 counts stop_ids instead (where stop_ids are that list).
  int eos_count = 0;
};

struct BeamAnswer {
  std::vector<int32_t> tokens;  // the new tokens, without the stop token that ended them
  float score = 0;              // HF's sequences_scores: the log-probability sum / length^length_penalty
};

// choice: greedy (temperature 0) with its repetition_penalty and no_repeat_ngram_size, which apply
// per beam. stop_ids: the tokens that end an answer (their count sets K, as HF's EOS ids do, unless
// beams.eos_count says otherwise).
// Throws an Error for an empty prompt, num_beams < 1, a sampled choice or a length penalty that is
// not finite.
BeamAnswer beam_search(Decoder& decoder, const std::vector<int32_t>& prompt, int max_new_tokens,
                       const BeamOptions& beams, const TokenChoice& choice, const std::vector<int32_t>& stop_ids);

}  // namespace ktune::model
