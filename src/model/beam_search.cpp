#include "model/beam_search.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <utility>

#include "core/error.h"
#include "model/kv_cache.h"

namespace ktune::model {

namespace {

// HF's mark for what can no longer be chosen: added to a score, not replacing it.
constexpr float kNever = -1.0e9f;

// A beam's answer so far and its score: running beams their log-probability sum, finished ones
// that sum over their length^length_penalty.
struct Hypothesis {
  std::vector<int32_t> tokens;
  float score = kNever;
  bool finished = false;
};

// One of the K continuations a step keeps: beam `parent` followed by `token`.
struct Continuation {
  int64_t parent = 0;
  int32_t token = 0;
  float score = 0;  // the parent's sum + the token's log-probability
  bool ends = false;  // a stop token, or the length limit
};

// log_softmax in place, in f32 as torch's: x - max - log(sum exp(x - max)).   x (V)
void log_softmax(float* x, int64_t V) {
  const float top = *std::max_element(x, x + V);
  double sum = 0;
  for (int64_t v = 0; v < V; ++v) sum += std::exp(double(x[v] - top));
  const float log_sum = float(std::log(sum));
  for (int64_t v = 0; v < V; ++v) x[v] = (x[v] - top) - log_sum;
}

// The indices of the k largest of scores (n), largest first; equal scores: the lower index first.
std::vector<int64_t> top_indices(const std::vector<float>& scores, int64_t k) {
  std::vector<int64_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  k = std::min<int64_t>(k, int64_t(order.size()));
  auto better = [&](int64_t a, int64_t b) {
    const float sa = scores[size_t(a)], sb = scores[size_t(b)];
    return sa > sb || (sa == sb && a < b);
  };
  std::partial_sort(order.begin(), order.begin() + k, order.end(), better);
  order.resize(size_t(k));
  return order;
}

bool all_have_finished(const std::vector<Hypothesis>& hypotheses) {
  return std::all_of(hypotheses.begin(), hypotheses.end(), [](const Hypothesis& h) { return h.finished; });
}

float length_norm(int64_t length, float length_penalty) {
  return float(std::pow(double(length), double(length_penalty)));
}

void check_options(const std::vector<int32_t>& prompt, const BeamOptions& beams, const TokenChoice& choice) {
  if (prompt.empty()) throw Error("beam search", "the prompt has no tokens");
  if (beams.num_beams < 1) throw Error("num_beams", "must be at least 1, not " + std::to_string(beams.num_beams));
  if (!std::isfinite(beams.length_penalty))
    throw Error("length_penalty", "must be a finite number, not " + std::to_string(beams.length_penalty));
  check_token_choice(choice);
  if (choice.temperature != 0)
    throw Error("beam search", "chooses greedily: temperature must be 0 (sampled beams are not built)");
}

}  // namespace

BeamAnswer beam_search(Decoder& decoder, const std::vector<int32_t>& prompt, int max_new_tokens,
                       const BeamOptions& beams, const TokenChoice& choice, const std::vector<int32_t>& stop_ids) {
  check_options(prompt, beams, choice);
  if (max_new_tokens <= 0) return {};
  const int64_t N = beams.num_beams, V = decoder.config().vocab_size;
  const int64_t eos_count = beams.eos_count > 0 ? beams.eos_count : int64_t(stop_ids.size());
  const int64_t K = std::max<int64_t>(2, 1 + eos_count) * N;
  auto is_stop = [&](int32_t id) { return std::find(stop_ids.begin(), stop_ids.end(), id) != stop_ids.end(); };

  // Every beam starts as the prompt (its cache copied from one pass); only the first counts at first.
  const int64_t capacity = int64_t(prompt.size()) + max_new_tokens;
  std::vector<KvCache> caches, spare;
  for (int64_t b = 0; b < N; ++b) {
    caches.emplace_back(decoder.config(), capacity);
    spare.emplace_back(decoder.config(), capacity);
  }
  std::vector<float> logits(size_t(N * V));  // (N, V): each running beam's next-token logits
  decoder.forward_cached(prompt.data(), int64_t(prompt.size()), caches[0], logits.data());
  for (int64_t b = 1; b < N; ++b) {
    caches[size_t(b)].copy_from(caches[0]);
    std::copy(logits.begin(), logits.begin() + V, logits.begin() + b * V);
  }
  std::vector<Hypothesis> running(static_cast<size_t>(N)), finished(static_cast<size_t>(N));
  running[0].score = 0;
  bool improvable = true;  // HF's is_early_stop_heuristic_unsatisfied: once false, stays false

  std::vector<float> sums(size_t(N * V));  // (N, V): a beam's sum + each next token's log-probability
  for (int64_t length = 0;; ++length) {  // length: the tokens every running beam holds
    for (int64_t b = 0; b < N; ++b) {
      float* row = logits.data() + b * V;
      log_softmax(row, V);
      apply_context_penalties(row, V, prompt, running[size_t(b)].tokens, choice);
      for (int64_t v = 0; v < V; ++v) sums[size_t(b * V + v)] = row[v] + running[size_t(b)].score;
    }
    std::vector<Continuation> continuations;  // the K best, best first
    for (int64_t index : top_indices(sums, K)) {
      const int32_t token = int32_t(index % V);
      continuations.push_back({index / V, token, sums[size_t(index)], is_stop(token) || length + 1 >= max_new_tokens});
    }
    auto grown = [&](const Continuation& c) {
      std::vector<int32_t> tokens = running[size_t(c.parent)].tokens;
      tokens.push_back(c.token);
      return tokens;
    };

    // The finished: those of the first N continuations that end, scored by length, merged with the
    // N best so far (a continuation that does not end, or cannot count any more, is marked kNever).
    const bool all_finished = all_have_finished(finished);
    const float norm = length_norm(length + 1, beams.length_penalty);
    std::vector<float> merged_scores;
    for (const Hypothesis& h : finished) merged_scores.push_back(h.score);
    for (size_t c = 0; c < continuations.size(); ++c) {
      const bool just_finished = continuations[c].ends && int64_t(c) < N;
      float score = continuations[c].score / norm;
      if (all_finished && beams.early_stopping) score += kNever;
      if (!improvable) score += kNever;
      if (!just_finished) score += kNever;
      merged_scores.push_back(score);
    }
    std::vector<Hypothesis> kept;
    for (int64_t m : top_indices(merged_scores, N)) {
      if (m < N) {
        kept.push_back(finished[size_t(m)]);
      } else {
        const Continuation& c = continuations[size_t(m - N)];
        kept.push_back({grown(c), merged_scores[size_t(m)], c.ends && m - N < N});
      }
    }

    // The running: the N best continuations that do not end (those that do marked kNever).
    std::vector<float> running_scores;
    for (const Continuation& c : continuations) running_scores.push_back(c.score + (c.ends ? kNever : 0.0f));
    std::vector<Hypothesis> next;
    std::vector<int64_t> parents;
    for (int64_t r : top_indices(running_scores, N)) {
      next.push_back({grown(continuations[size_t(r)]), running_scores[size_t(r)], false});
      parents.push_back(continuations[size_t(r)].parent);
    }
    finished = std::move(kept);
    running = std::move(next);

    // Can a running beam still beat the worst of the finished? (HF's heuristic: its sum over its
    // length now; a slot not yet finished always can be filled.)
    const float best_running = running[0].score / length_norm(length + 1, beams.length_penalty);
    float worst_finished = finished[0].score;
    for (const Hypothesis& h : finished) worst_finished = std::min(worst_finished, h.score);
    bool beatable = false;
    for (const Hypothesis& h : finished) beatable = beatable || best_running > (h.finished ? worst_finished : kNever);
    improvable = improvable && beatable;
    const bool every_continuation_ends =
        std::all_of(continuations.begin(), continuations.end(), [](const Continuation& c) { return c.ends; });
    const bool now_all_finished = all_have_finished(finished);
    if (!improvable || (now_all_finished && beams.early_stopping) || every_continuation_ends) break;

    // Each running beam continues its parent's cache with its new token.
    for (int64_t b = 0; b < N; ++b) spare[size_t(b)].copy_from(caches[size_t(parents[size_t(b)])]);
    std::swap(caches, spare);
    std::vector<int32_t> tokens;
    std::vector<CachedSequence> sequences;
    for (int64_t b = 0; b < N; ++b) {
      tokens.push_back(running[size_t(b)].tokens.back());
      sequences.push_back({&caches[size_t(b)], 1});
    }
    decoder.forward_cached(tokens.data(), sequences, logits.data());
  }

  BeamAnswer answer{finished[0].tokens, finished[0].score};
  if (!answer.tokens.empty() && is_stop(answer.tokens.back())) answer.tokens.pop_back();
  return answer;
}

}  // namespace ktune::model
