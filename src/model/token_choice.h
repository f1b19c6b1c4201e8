// Choosing the next token from a step's logits, as transformers' generate does: greedily (the
// largest logit, the lowest id among equals, as torch.argmax), or by sampling from
// softmax(logits / temperature) after keeping only the top_k largest, then the smallest set of
// the most likely whose probability reaches top_p, then those at least min_p times as likely as the
// most likely (HF's TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper, MinPLogitsWarper,
// in that order). Before either, a repetition penalty (HF's RepetitionPenaltyLogitsProcessor) makes
// the tokens already in the context less likely, and a token that would repeat an n-gram of the
// context is ruled out (HF's NoRepeatNGramLogitsProcessor, no_repeat_ngram_size). A draw is
// uniform01_double(seed, index): the same seed and index give the same token on any machine. A draw
// never sorts the vocabulary: the top_k and top_p cuts are found by bucketing the logits by value (a
// few passes over them), and the draw walks the kept tokens in id order.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace ktune::model {

struct TokenChoice {
  float temperature = 0;  // 0: greedy; > 0: sample
  int64_t top_k = 0;      // keep the k most likely (0: all)
  float top_p = 1.0f;     // keep the most likely until their probability reaches p (1: all)
  uint64_t seed = 0;
  float min_p = 0.0f;               // keep those at least min_p times as likely as the most likely (0: all)
  float repetition_penalty = 1.0f;  // > 1: the context's tokens less likely (1: none); greedy or sampled
  int64_t no_repeat_ngram_size = 0;  // n > 0: no n-gram occurs twice in the context (0: none)
};

// Throws an Error naming the option that is out of range (temperature < 0, top_k < 0, top_p not in
// (0, 1], min_p not in [0, 1], repetition_penalty not positive, no_repeat_ngram_size < 0).
void check_token_choice(const TokenChoice& choice);

// What a sampled choice (temperature > 0) draws from: the tokens kept, most likely first (equal
// logits: lower id first), each with its probability (summing to 1).
std::vector<std::pair<int32_t, double>> sampling_distribution(const float* logits, int64_t V, const TokenChoice& choice);

// The token a sampled choice draws at u in [0, 1): walking sampling_distribution's tokens in id
// order, the first whose cumulative probability passes u.
int32_t sample_token(const float* logits, int64_t V, const TokenChoice& choice, double u);

// logits (V). draw_index: which draw of the seed's stream this is (the decoding step): u is
// uniform01_double(seed, draw_index).
int32_t choose_token(const float* logits, int64_t V, const TokenChoice& choice, uint64_t draw_index);

int32_t argmax_token(const float* logits, int64_t V);

// HF's repetition penalty, in place: each token id in context (once however often it occurs) has
// its logit divided by penalty where positive, multiplied by it where negative. logits (V).
void apply_repetition_penalty(float* logits, int64_t V, const int32_t* context, int64_t n, float penalty);

// HF's no_repeat_ngram_size, in place: every token that would end an n-gram (n = ngram_size) already
// in context, after the context's last n - 1 tokens, gets logit -inf. Nothing when the context is
// shorter than n - 1 tokens or ngram_size is 0. logits (V); context (n_context).
void ban_repeated_ngrams(float* logits, int64_t V, const int32_t* context, int64_t n_context, int64_t ngram_size);

// Both of the above, as a decoding step applies them to one answer's next-token scores: over its
// context, the prompt and the answer so far (nothing to do, nothing built, when neither is set).
// scores (V): logits, or log-probabilities in a beam search (HF applies them there after log_softmax).
void apply_context_penalties(float* scores, int64_t V, const std::vector<int32_t>& prompt,
                             const std::vector<int32_t>& answer, const TokenChoice& choice);

}  // namespace ktune::model
