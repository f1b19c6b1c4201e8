#include "train/sharded_layout.h"

#include <algorithm>

#include "core/error.h"

namespace ktune::train {

namespace {
int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
}  // namespace

FlatShardLayout FlatShardLayout::plan(const std::vector<int64_t>& numels, int world_size) {
  check(world_size >= 1, "FlatShardLayout", "world size " + std::to_string(world_size) + " is not positive");
  FlatShardLayout layout;
  layout.world_size = world_size;
  int64_t end = 0;
  for (int64_t n : numels) {
    check(n >= 0, "FlatShardLayout", "negative parameter size " + std::to_string(n));
    layout.numel.push_back(n);
    layout.offset.push_back(end);
    end = round_up(end + n, kAlignFloats);
  }
  layout.padded = round_up(end, kAlignFloats * world_size);
  return layout;
}

int64_t FlatShardLayout::payload() const {
  int64_t sum = 0;
  for (int64_t n : numel) sum += n;
  return sum;
}

std::pair<int64_t, int64_t> FlatShardLayout::param_in_shard(size_t i, int rank) const {
  const int64_t lo = std::max(offset[i], shard_begin(rank));
  const int64_t hi = std::min(offset[i] + numel[i], shard_begin(rank) + shard_size());
  return lo < hi ? std::pair{lo, hi} : std::pair{lo, lo};
}

int64_t layer_of_parameter(const std::string& name) {
  static const std::string kLayers = "model.layers.";
  size_t at = name.rfind("base_model.model.", 0) == 0 ? std::string("base_model.model.").size() : 0;
  if (name.compare(at, kLayers.size(), kLayers) != 0) return -1;
  at += kLayers.size();
  int64_t layer = 0;
  size_t digits = 0;
  while (at + digits < name.size() && name[at + digits] >= '0' && name[at + digits] <= '9')
    layer = layer * 10 + (name[at + digits++] - '0');
  if (digits == 0 || at + digits >= name.size() || name[at + digits] != '.') return -1;
  return layer;
}

}  // namespace ktune::train
