// Nearest-name suggestions for config errors ("did you mean `optimizer.lr`?"): the edit distance
// between a key that was given and the keys that are valid there. Nothing else.
#pragma once

#include <string>
#include <vector>

#include "train/config.h"

namespace ktune::train {

// Levenshtein distance (insertions, deletions, substitutions; each costs 1).
int edit_distance(const std::string& a, const std::string& b);

// The candidate nearest to `given`, or "" when none is near enough to be a plausible typo
// (distance at most max(2, length/3); also a candidate whose last dotted part equals the last part
// of `given` — "lr" → "optimizer.lr").
std::string nearest_name(const std::string& given, const std::vector<std::string>& candidates);

// "; did you mean `X`?" or "" when nothing is near.
std::string did_you_mean(const std::string& given, const std::vector<std::string>& candidates);

// Every dotted key path of a tree's maps ("model", "model.lora_rank", …), lists not entered.
std::vector<std::string> all_key_paths(const ConfigNode& tree);

}  // namespace ktune::train
