#include "model/token_choice.h"

#include <algorithm>
#include <cmath>
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
}

int32_t argmax_token(const float* logits, int64_t V) {
  int32_t best = 0;
  for (int32_t v = 1; v < V; ++v)
    if (logits[v] > logits[best]) best = v;
  return best;
}

std::vector<std::pair<int32_t, double>> sampling_distribution(const float* logits, int64_t V, const TokenChoice& choice) {
  check_token_choice(choice);
  if (choice.temperature == 0) throw Error("temperature", "0 chooses greedily: there is no distribution to sample");
  // The candidates, most likely first, cut to top_k.
  std::vector<int32_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  const int64_t k = choice.top_k > 0 ? std::min(choice.top_k, V) : V;
  auto more_likely = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  std::partial_sort(order.begin(), order.begin() + k, order.end(), more_likely);
  order.resize(size_t(k));
  // softmax(logits / temperature) over them, in double.
  std::vector<std::pair<int32_t, double>> kept(order.size());
  const double top = double(logits[order[0]]) / choice.temperature;
  double sum = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    kept[i] = {order[i], std::exp(double(logits[order[i]]) / choice.temperature - top)};
    sum += kept[i].second;
  }
  for (auto& token : kept) token.second /= sum;
  // top_p: the shortest prefix whose probability reaches top_p (at least one token), renormalised.
  if (choice.top_p < 1) {
    double cumulative = 0;
    size_t n = 0;
    while (n < kept.size() && cumulative < choice.top_p) cumulative += kept[n++].second;
    kept.resize(n);
    for (auto& token : kept) token.second /= cumulative;
  }
  return kept;
}

int32_t choose_token(const float* logits, int64_t V, const TokenChoice& choice, uint64_t draw_index) {
  if (choice.temperature == 0) return argmax_token(logits, V);
  const auto kept = sampling_distribution(logits, V, choice);
  const double u = uniform01(choice.seed, draw_index);
  double cumulative = 0;
  for (const auto& [id, probability] : kept) {
    cumulative += probability;
    if (u < cumulative) return id;
  }
  return kept.back().first;  // u within rounding of 1
}

}  // namespace ktune::model
