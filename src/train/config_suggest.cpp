// Edit-distance suggestions for config errors. See config_suggest.h.
#include "train/config_suggest.h"

#include <algorithm>

namespace ktune::train {

int edit_distance(const std::string& a, const std::string& b) {
  std::vector<int> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = static_cast<int>(j);
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = static_cast<int>(i);
    for (std::size_t j = 1; j <= b.size(); ++j) {
      int substitute = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, substitute});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

static std::string last_part(const std::string& s) {
  std::size_t dot = s.rfind('.');
  return dot == std::string::npos ? s : s.substr(dot + 1);
}

std::string nearest_name(const std::string& given, const std::vector<std::string>& candidates) {
  std::string best;
  int best_distance = 1 << 30;
  for (const std::string& c : candidates) {
    if (c == given) continue;
    int d = edit_distance(given, c);
    if (d < best_distance) {
      best_distance = d;
      best = c;
    }
  }
  int limit = std::max(2, static_cast<int>(given.size()) / 3);
  if (!best.empty() && best_distance <= limit) return best;
  // A key given without its section ("lr" for "optimizer.lr").
  for (const std::string& c : candidates)
    if (c != given && last_part(c) == last_part(given)) return c;
  return "";
}

std::string did_you_mean(const std::string& given, const std::vector<std::string>& candidates) {
  std::string best = nearest_name(given, candidates);
  return best.empty() ? std::string() : "; did you mean `" + best + "`?";
}

static void collect(const ConfigNode& node, const std::string& prefix, std::vector<std::string>& out) {
  if (!node.is_map()) return;
  for (const auto& [k, v] : node.entries()) {
    std::string path = prefix.empty() ? k : prefix + "." + k;
    out.push_back(path);
    collect(v, path, out);
  }
}

std::vector<std::string> all_key_paths(const ConfigNode& tree) {
  std::vector<std::string> out;
  collect(tree, "", out);
  return out;
}

}  // namespace ktune::train
