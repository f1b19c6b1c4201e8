// Fingerprints of parameters compared across ranks (see weights_fingerprint.h).
#include "train/weights_fingerprint.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "core/random_bits.h"

namespace ktune::train {

namespace {

constexpr int64_t kBlockBytes = int64_t(1) << 20;  // the unit of parallel hashing

// Four interleaved splitmix64 chains over the block's 8-byte words (independent chains keep the
// multiplier busy), its tail zero-padded into one more word, folded with the block's index.
uint64_t block_hash(const unsigned char* bytes, int64_t n, uint64_t index) {
  uint64_t lane[4] = {splitmix64(index), splitmix64(index + 1), splitmix64(index + 2), splitmix64(index + 3)};
  const int64_t words = n / 8;
  for (int64_t w = 0; w < words; ++w) {
    uint64_t word;
    std::memcpy(&word, bytes + 8 * w, 8);
    lane[w % 4] = splitmix64(lane[w % 4] ^ word);
  }
  uint64_t tail = 0;
  std::memcpy(&tail, bytes + 8 * words, size_t(n - 8 * words));
  uint64_t h = splitmix64(uint64_t(n) ^ tail);
  for (uint64_t l : lane) h = splitmix64(h ^ l);
  return h;
}

uint64_t bytes_hash(const unsigned char* bytes, int64_t n) {
  const int64_t blocks = (n + kBlockBytes - 1) / kBlockBytes;
  std::vector<uint64_t> hashes(static_cast<size_t>(blocks));
  parallel_for(blocks, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b)
      hashes[size_t(b)] = block_hash(bytes + b * kBlockBytes, std::min(kBlockBytes, n - b * kBlockBytes), uint64_t(b));
  });
  uint64_t h = splitmix64(uint64_t(n));
  for (uint64_t b : hashes) h = splitmix64(h ^ b);
  return h;
}

std::string hex(uint64_t v) {
  char text[24];
  std::snprintf(text, sizeof text, "%016" PRIx64, v);
  return text;
}

// Rank 0's entries against every rank's: the ranks whose entry differs, in order.
std::vector<int> ranks_differing(const std::vector<uint64_t>& all, size_t per_rank, size_t entry, int size) {
  std::vector<int> ranks;
  for (int r = 1; r < size; ++r)
    if (all[size_t(r) * per_rank + entry] != all[entry]) ranks.push_back(r);
  return ranks;
}

// "", or, where more than the first rank differ, " (so do ranks 2, 3)".
std::string also_differing(const std::vector<int>& ranks) {
  if (ranks.size() < 2) return "";
  std::string text = " (so do ranks ";
  for (size_t i = 1; i < ranks.size(); ++i) text += (i > 1 ? ", " : "") + std::to_string(ranks[i]);
  return text + ")";
}

}  // namespace

uint64_t parameter_fingerprint(const model::Parameter& p) {
  uint64_t h = fnv1a64(p.name);
  if (!p.value.defined()) return h;
  h = splitmix64(h ^ fnv1a64(dtype_name(p.value.dtype())));
  for (int64_t d : p.value.shape().dims) h = splitmix64(h ^ uint64_t(d));
  return splitmix64(h ^ bytes_hash(static_cast<const unsigned char*>(p.value.raw()), int64_t(p.value.bytes())));
}

void check_same_parameters(const std::vector<model::Parameter*>& params, dist::ProcessGroup& group,
                           const std::string& what) {
  const int size = group.size();
  if (size == 1) return;
  std::vector<uint64_t> mine;
  uint64_t all_of_them = 0;
  for (const model::Parameter* p : params) {
    mine.push_back(parameter_fingerprint(*p));
    all_of_them = splitmix64(all_of_them ^ mine.back());
  }
  // First the count and the fingerprint of all of them, 16 bytes a rank.
  const uint64_t summary[2] = {uint64_t(mine.size()), all_of_them};
  std::vector<uint64_t> summaries(size_t(2 * size));
  group.all_gather_bytes(summaries.data(), summary, int64_t(sizeof summary));
  const std::vector<int> other_count = ranks_differing(summaries, 2, 0, size);
  if (!other_count.empty())
    throw Error(what, "rank " + std::to_string(other_count[0]) + " holds " +
                          std::to_string(summaries[2 * size_t(other_count[0])]) + " parameters, rank 0 " +
                          std::to_string(summaries[0]) + also_differing(other_count) +
                          ": every rank must load the same model (checkpointer.checkpoint_dir, the model's config)");
  const std::vector<int> differing = ranks_differing(summaries, 2, 1, size);
  if (differing.empty()) return;
  // They differ (every rank knows it): the per-parameter fingerprints name the first that does.
  std::vector<uint64_t> all(mine.size() * size_t(size));
  group.all_gather_bytes(all.data(), mine.data(), int64_t(mine.size() * sizeof(uint64_t)));
  const int first_rank = differing[0];
  size_t first = 0;
  while (first + 1 < mine.size() && all[size_t(first_rank) * mine.size() + first] == all[first]) ++first;
  throw Error(what, "rank " + std::to_string(first_rank) + " differs from rank 0" + also_differing(differing) +
                        ", first at " + params[first]->name + " (rank 0's fingerprint " + hex(all[first]) + ", rank " +
                        std::to_string(first_rank) + "'s " + hex(all[size_t(first_rank) * mine.size() + first]) +
                        "): every rank must load the same checkpoint files and use the same seed");
}

}  // namespace ktune::train
