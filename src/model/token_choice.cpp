#include "model/token_choice.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/random_bits.h"

namespace ktune::model {

void check_token_choice(const TokenChoice& choice) {
  if (!(choice.temperature >= 0) || !std::isfinite(choice.temperature))
    throw Error("temperature", "must be 0 (greedy) or positive, not " + std::to_string(choice.temperature));
  if (choice.top_k < 0) throw Error("top_k", "must be 0 (all tokens) or positive, not " + std::to_string(choice.top_k));
  if (!(choice.top_p > 0 && choice.top_p <= 1))
    throw Error("top_p", "must be in (0, 1] (1: all tokens), not " + std::to_string(choice.top_p));
  if (!(choice.min_p >= 0 && choice.min_p <= 1))
    throw Error("min_p", "must be in [0, 1] (0: all tokens), not " + std::to_string(choice.min_p));
  if (!(choice.repetition_penalty > 0) || !std::isfinite(choice.repetition_penalty))
    throw Error("repetition_penalty", "must be positive (1: none), not " + std::to_string(choice.repetition_penalty));
  if (choice.no_repeat_ngram_size < 0)
    throw Error("no_repeat_ngram_size", "must be 0 (none) or positive, not " + std::to_string(choice.no_repeat_ngram_size));
}

void apply_context_penalties(float* scores, int64_t V, const std::vector<int32_t>& prompt,
                             const std::vector<int32_t>& answer, const TokenChoice& choice) {
  if (choice.repetition_penalty == 1.0f && choice.no_repeat_ngram_size <= 0) return;
  std::vector<int32_t> context = prompt;
  context.insert(context.end(), answer.begin(), answer.end());
  apply_repetition_penalty(scores, V, context.data(), int64_t(context.size()), choice.repetition_penalty);
  ban_repeated_ngrams(scores, V, context.data(), int64_t(context.size()), choice.no_repeat_ngram_size);
}

void apply_repetition_penalty(float* logits, int64_t V, const int32_t* context, int64_t n, float penalty) {
  if (penalty == 1.0f) return;
  std::vector<int32_t> ids(context, context + n);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  for (int32_t id : ids) {
    if (id < 0 || id >= V) throw Error("repetition penalty", "token id " + std::to_string(id) + " is outside the vocabulary");
    float& logit = logits[id];
    logit = logit < 0 ? logit * penalty : logit / penalty;
  }
}

void ban_repeated_ngrams(float* logits, int64_t V, const int32_t* context, int64_t n_context, int64_t ngram_size) {
  if (ngram_size <= 0 || n_context < ngram_size - 1) return;
  const int64_t prefix = ngram_size - 1;            // the n - 1 tokens an n-gram's last one follows
  const int32_t* tail = context + n_context - prefix;  // the context's last n - 1 tokens
  // Each n-gram context[i .. i + n) whose first n - 1 tokens are the tail rules out its last.
  for (int64_t i = 0; i + ngram_size <= n_context; ++i) {
    if (!std::equal(tail, tail + prefix, context + i)) continue;
    const int32_t id = context[i + prefix];
    if (id < 0 || id >= V) throw Error("no_repeat_ngram_size", "token id " + std::to_string(id) + " is outside the vocabulary");
    logits[id] = -std::numeric_limits<float>::infinity();
  }
}

int32_t argmax_token(const float* logits, int64_t V) {
  int32_t best = 0;
  for (int32_t v = 1; v < V; ++v)
    if (logits[v] > logits[best]) best = v;
  return best;
}

namespace {

// A token's place in the order of likeliness as one integer, larger = more likely: the logit's
// bits made monotone (-0 as +0) above the id's complement (equal logits: the lower id first). A
// strict order, so "the k most likely" is one set however it is found.
uint64_t likeliness_key(float logit, int32_t id) {
  uint32_t bits;
  const float value = logit + 0.0f;  // -0 -> +0
  std::memcpy(&bits, &value, sizeof bits);
  bits = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  return (uint64_t(bits) << 32) | uint64_t(0xffffffffu - uint32_t(id));
}

// The least likely token of the shortest most-likely-first prefix of `members` (ids) whose summed
// size (a token's weight, or 1 each where `weight` is null) reaches `wanted` (the last member if
// none does), found without sorting them all: spread the members over buckets by logit (each
// bucket's logits above the next one's), walk the buckets from the most likely, and go on into the
// bucket where the sum crosses `wanted`, until few enough remain to sort.
int32_t last_of_prefix(const float* logits, std::vector<int32_t> members, const double* weight, double wanted) {
  constexpr int kBuckets = 2048;
  constexpr size_t kSorted = 512;  // members left when they are sorted
  double above = 0;                // the size of the tokens ranked above the members: below wanted
  std::vector<double> bucket_size(kBuckets);
  std::vector<uint16_t> bucket(members.size());
  while (members.size() > kSorted) {
    float low = INFINITY, high = -INFINITY;
    for (int32_t id : members) {
      const float x = logits[id];
      if (std::isfinite(x)) low = std::min(low, x), high = std::max(high, x);
    }
    if (!(high > low)) break;  // one finite value: the order is the ids'
    const float scale = float(kBuckets - 1) / (high - low);
    for (size_t i = 0; i < members.size(); ++i) {
      const float place = (logits[members[i]] - low) * scale;  // monotone in the logit; -inf, NaN: 0
      bucket[i] = uint16_t(place > 0 ? std::min(place, float(kBuckets - 1)) : 0.0f);
    }
    std::fill(bucket_size.begin(), bucket_size.end(), 0.0);
    for (size_t i = 0; i < members.size(); ++i) bucket_size[bucket[i]] += weight ? weight[members[i]] : 1.0;
    int crossing = kBuckets - 1;
    for (; crossing > 0 && above + bucket_size[size_t(crossing)] < wanted; --crossing) above += bucket_size[size_t(crossing)];
    size_t kept = 0;
    for (size_t i = 0; i < members.size(); ++i)
      if (bucket[i] == crossing) members[kept++] = members[i];
    if (kept == members.size()) break;  // no narrower (a range past float's, high - low = inf): sort them
    members.resize(kept);
  }
  std::sort(members.begin(), members.end(),
            [&](int32_t a, int32_t b) { return likeliness_key(logits[a], a) > likeliness_key(logits[b], b); });
  for (int32_t id : members) {
    above += weight ? weight[id] : 1.0;
    if (above >= wanted) return id;
  }
  return members.back();
}

// What a sampled choice keeps: the tokens at least as likely as `last`, their weights
// exp((logit - max) / temperature) in double (0 for the others), and the weights' sum in id order.
struct KeptTokens {
  const float* logits;
  uint64_t last_key = 0;       // the least likely kept token's likeliness_key
  std::vector<double> weight;  // (V)
  double total = 0;

  bool keeps(int32_t id) const { return likeliness_key(logits[id], id) >= last_key; }
};

// The top_k cut, then top_p's: a token is kept while the probability ranked above it is below
// top_p, as HF's TopPLogitsWarper keeps it (at least one token); then min_p's: a token is kept if
// its weight (its probability over the most likely's) is at least min_p.
KeptTokens kept_tokens(const float* logits, int64_t V, const TokenChoice& choice) {
  check_token_choice(choice);
  if (choice.temperature == 0) throw Error("temperature", "0 chooses greedily: there is no distribution to sample");
  KeptTokens kept{logits};
  std::vector<int32_t> candidates(static_cast<size_t>(V));  // the kept ids, in id order
  std::iota(candidates.begin(), candidates.end(), 0);
  if (choice.top_k > 0 && choice.top_k < V) {
    const int32_t last = last_of_prefix(logits, std::move(candidates), nullptr, double(choice.top_k));
    kept.last_key = likeliness_key(logits[last], last);
    candidates = {};
    for (int32_t v = 0; v < int32_t(V); ++v)
      if (kept.keeps(v)) candidates.push_back(v);
  }
  const double top = double(logits[argmax_token(logits, V)]), inverse_temperature = 1.0 / double(choice.temperature);
  kept.weight.assign(size_t(V), 0.0);
  for (int32_t id : candidates) {
    kept.weight[size_t(id)] = std::exp((double(logits[id]) - top) * inverse_temperature);
    kept.total += kept.weight[size_t(id)];
  }
  if (choice.top_p < 1) {
    const int32_t last = last_of_prefix(logits, std::move(candidates), kept.weight.data(), double(choice.top_p) * kept.total);
    kept.last_key = likeliness_key(logits[last], last);
  }
  if (choice.min_p > 0) {  // the least likely kept token whose weight reaches min_p (the top's is 1)
    uint64_t last_key = ~uint64_t(0);
    for (int32_t v = 0; v < int32_t(V); ++v)
      if (kept.keeps(v) && kept.weight[size_t(v)] >= double(choice.min_p))
        last_key = std::min(last_key, likeliness_key(logits[v], v));
    kept.last_key = last_key;
  }
  if (choice.top_p < 1 || choice.min_p > 0) {
    kept.total = 0;
    for (int32_t v = 0; v < int32_t(V); ++v) {
      if (kept.keeps(v)) {
        kept.total += kept.weight[size_t(v)];
      } else {
        kept.weight[size_t(v)] = 0;
      }
    }
  }
  return kept;
}

}  // namespace

std::vector<std::pair<int32_t, double>> sampling_distribution(const float* logits, int64_t V, const TokenChoice& choice) {
  const KeptTokens kept = kept_tokens(logits, V, choice);
  std::vector<std::pair<int32_t, double>> distribution;
  for (int32_t v = 0; v < int32_t(V); ++v)
    if (kept.keeps(v)) distribution.emplace_back(v, kept.weight[size_t(v)] / kept.total);
  std::sort(distribution.begin(), distribution.end(), [&](const auto& a, const auto& b) {
    return likeliness_key(logits[a.first], a.first) > likeliness_key(logits[b.first], b.first);
  });
  return distribution;
}

int32_t sample_token(const float* logits, int64_t V, const TokenChoice& choice, double u) {
  const KeptTokens kept = kept_tokens(logits, V, choice);
  // The first kept token, in id order, whose cumulative weight passes u of the kept weight.
  const double target = u * kept.total;
  double cumulative = 0;
  int32_t last_seen = -1;
  for (int32_t v = 0; v < int32_t(V); ++v) {
    if (!kept.keeps(v)) continue;
    cumulative += kept.weight[size_t(v)];
    if (target < cumulative) return v;
    last_seen = v;
  }
  return last_seen;  // u within rounding of 1
}

int32_t choose_token(const float* logits, int64_t V, const TokenChoice& choice, uint64_t draw_index) {
  if (choice.temperature == 0) {
    check_token_choice(choice);
    return argmax_token(logits, V);
  }
  return sample_token(logits, V, choice, uniform01_double(choice.seed, draw_index));
}

}  // namespace ktune::model
