// The loader (see data_loader.h): epoch plans, batch assembly, and the saved position.
#include "data/data_loader.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace ktune {

namespace {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// A uniform draw in [0, bound) without modulo bias (Lemire's method).
uint64_t bounded(uint64_t& state, uint64_t bound) {
  unsigned __int128 m = (unsigned __int128)splitmix64(state) * bound;
  uint64_t low = (uint64_t)m;
  if (low < bound) {
    uint64_t threshold = (0 - bound) % bound;
    while (low < threshold) {
      m = (unsigned __int128)splitmix64(state) * bound;
      low = (uint64_t)m;
    }
  }
  return (uint64_t)(m >> 64);
}

}  // namespace

std::vector<int64_t> shuffled_order(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order((size_t)n);
  std::iota(order.begin(), order.end(), 0);
  uint64_t state = seed * 0xD1B54A32D192ED03ull ^ (uint64_t)epoch * 0x8CB92BA72F3D8DD7ull ^ 0x5851F42D4C957F2Dull;
  for (int64_t i = n - 1; i > 0; --i) {
    int64_t j = (int64_t)bounded(state, (uint64_t)i + 1);
    std::swap(order[(size_t)i], order[(size_t)j]);
  }
  return order;
}

int64_t Batch::num_label_tokens() const {
  return std::count_if(labels.begin(), labels.end(), [](int32_t l) { return l != kIgnoreIndex; });
}

nlohmann::json LoaderState::to_json() const {
  return {{"epoch", epoch},           {"next_batch", next_batch},     {"seed", seed},
          {"num_samples", num_samples}, {"num_tokens", num_tokens},   {"batch_size", batch_size},
          {"max_seq_len", max_seq_len}, {"world_size", world_size},   {"shuffle", shuffle},
          {"packed", packed},           {"split_across_pack", split_across_pack}, {"drop_last", drop_last}};
}

LoaderState LoaderState::from_json(const nlohmann::json& j) {
  LoaderState s;
  try {
    s.epoch = j.at("epoch").get<int64_t>();
    s.next_batch = j.at("next_batch").get<int64_t>();
    s.seed = j.at("seed").get<uint64_t>();
    s.num_samples = j.at("num_samples").get<int64_t>();
    s.num_tokens = j.at("num_tokens").get<int64_t>();
    s.batch_size = j.at("batch_size").get<int64_t>();
    s.max_seq_len = j.at("max_seq_len").get<int64_t>();
    s.world_size = j.at("world_size").get<int>();
    s.shuffle = j.at("shuffle").get<bool>();
    s.packed = j.at("packed").get<bool>();
    s.split_across_pack = j.at("split_across_pack").get<bool>();
    s.drop_last = j.at("drop_last").get<bool>();
  } catch (const nlohmann::json::exception& e) {
    throw Error("data loader state", std::string("malformed: ") + e.what());
  }
  return s;
}

DataLoader::DataLoader(std::shared_ptr<const TokenizedDataset> data, LoaderOptions options)
    : data_(std::move(data)), options_(options) {
  check(data_ != nullptr, "DataLoader", "no dataset");
  check(options_.batch_size >= 1, "batch_size", "must be at least 1, got " + std::to_string(options_.batch_size));
  check(options_.world_size >= 1 && options_.rank >= 0 && options_.rank < options_.world_size, "DataLoader",
        "rank " + std::to_string(options_.rank) + " is not within world size " + std::to_string(options_.world_size));
  check(!options_.packed || options_.max_seq_len > 0, "tokenizer.max_seq_len", "packing needs max_seq_len to be set");
  if (data_->size() == 0) throw Error("dataset", "the dataset is empty: there is nothing to load");
  set_epoch(0);
}

void DataLoader::plan_epoch() {
  const TokenizedDataset& d = *data_;
  const int64_t n = d.size();
  if (options_.shuffle) {
    order_ = shuffled_order(n, options_.seed, epoch_);
  } else {
    order_.resize((size_t)n);
    std::iota(order_.begin(), order_.end(), 0);
  }
  items_.clear();
  int64_t num_items = n;
  if (options_.packed) {
    const int64_t T = options_.max_seq_len;
    if (!options_.split_across_pack) {
      int64_t fill = 0;
      for (int64_t pos = 0; pos < n; ++pos) {
        int64_t len = d.length(order_[(size_t)pos]);
        if (len > T)
          throw Error("dataset: sample " + std::to_string(order_[(size_t)pos]),
                      "is " + std::to_string(len) + " tokens, longer than the pack length max_seq_len=" +
                          std::to_string(T) + " (set split_across_pack or raise max_seq_len)");
        if (items_.empty() || fill + len > T) {
          items_.push_back({pos, 0});
          fill = 0;
        }
        fill += len;
      }
    } else {
      // The stream of all tokens in order, cut every T tokens.
      items_.push_back({0, 0});
      int64_t room = T;
      int64_t pos = 0, off = 0;
      while (pos < n) {
        int64_t left = d.length(order_[(size_t)pos]) - off;
        if (left < room) {
          room -= left;
          ++pos;
          off = 0;
        } else if (left == room) {
          ++pos;
          off = 0;
          if (pos < n) items_.push_back({pos, 0});
          room = T;
        } else {
          off += room;
          items_.push_back({pos, off});
          room = T;
        }
      }
    }
    num_items = (int64_t)items_.size();
  }
  // torch's DistributedSampler (drop_last False, as torchtune builds it): ceil(items / ranks) each,
  // the global order made whole by repeating items from its start.
  per_rank_ = (num_items + options_.world_size - 1) / options_.world_size;
  num_batches_ = options_.drop_last ? per_rank_ / options_.batch_size
                                    : (per_rank_ + options_.batch_size - 1) / options_.batch_size;
  if (!options_.packed) items_.shrink_to_fit();
  num_items_ = num_items;
}

void DataLoader::set_epoch(int64_t epoch) {
  epoch_ = epoch;
  next_batch_ = 0;
  plan_epoch();
}

void DataLoader::fill_packed_row(int64_t item, int32_t* tokens, int32_t* labels, int32_t* positions,
                                 int32_t* doc_ids) const {
  const TokenizedDataset& d = *data_;
  const int64_t T = options_.max_seq_len;
  const int64_t n = d.size();
  const Cursor start = items_[(size_t)item];
  const Cursor end = item + 1 < (int64_t)items_.size() ? items_[(size_t)item + 1] : Cursor{n, 0};
  int64_t t = 0;
  int32_t doc = 0;
  for (int64_t pos = start.order_pos, off = start.offset;
       pos < end.order_pos || (pos == end.order_pos && off < end.offset); ++pos, off = 0) {
    const int64_t s = order_[(size_t)pos];
    const int64_t stop = pos == end.order_pos ? end.offset : d.length(s);
    auto ids = d.tokens(s);
    auto trained = d.trained(s);
    for (int64_t j = off; j < stop; ++j, ++t) {
      tokens[t] = ids[(size_t)j];
      labels[t] = trained[(size_t)j] ? ids[(size_t)j] : kIgnoreIndex;
      positions[t] = (int32_t)(j % T);
      doc_ids[t] = doc;
    }
    ++doc;
  }
  const int32_t last = t > 0 ? positions[t - 1] : -1;
  for (int64_t k = 0; t < T; ++t, ++k) {
    tokens[t] = options_.pad_id;
    labels[t] = kIgnoreIndex;
    positions[t] = (int32_t)std::min<int64_t>(last + 1 + k, T - 1);
    doc_ids[t] = doc;
  }
}

bool DataLoader::next(Batch* batch) {
  if (next_batch_ >= num_batches_) return false;
  const int64_t B_full = options_.batch_size;
  const int64_t first = next_batch_ * B_full;
  const int64_t B = std::min(B_full, per_rank_ - first);
  // The global item index of this rank's k-th item: past the last item, the order again from its start.
  auto item_of = [&](int64_t k) { return (options_.rank + k * (int64_t)options_.world_size) % num_items_; };
  const TokenizedDataset& d = *data_;
  int64_t T;
  if (options_.packed) {
    T = options_.max_seq_len;
  } else {
    T = 0;
    for (int64_t b = 0; b < B; ++b) T = std::max(T, d.length(order_[(size_t)item_of(first + b)]));
  }
  batch->batch_size = B;
  batch->seq_len = T;
  batch->epoch = epoch_;
  batch->index = next_batch_;
  batch->tokens.assign((size_t)(B * T), 0);
  batch->labels.assign((size_t)(B * T), 0);
  batch->positions.assign((size_t)(B * T), 0);
  batch->doc_ids.assign((size_t)(B * T), 0);
  for (int64_t b = 0; b < B; ++b) {
    int32_t* tok = batch->tokens.data() + b * T;
    int32_t* lab = batch->labels.data() + b * T;
    int32_t* pos = batch->positions.data() + b * T;
    int32_t* doc = batch->doc_ids.data() + b * T;
    const int64_t item = item_of(first + b);
    if (options_.packed) {
      fill_packed_row(item, tok, lab, pos, doc);
      continue;
    }
    const int64_t s = order_[(size_t)item];
    auto ids = d.tokens(s);
    auto trained = d.trained(s);
    const int64_t len = (int64_t)ids.size();
    for (int64_t t = 0; t < T; ++t) {
      const bool real = t < len;
      tok[t] = real ? ids[(size_t)t] : options_.pad_id;
      lab[t] = real && trained[(size_t)t] ? ids[(size_t)t] : kIgnoreIndex;
      pos[t] = (int32_t)t;
      doc[t] = real ? 0 : 1;
    }
  }
  ++next_batch_;
  return true;
}

void shift_labels(Batch& batch) {
  if (batch.seq_len == 0) return;
  for (int64_t b = 0; b < batch.batch_size; ++b) {
    int32_t* row = batch.labels.data() + b * batch.seq_len;
    for (int64_t t = 0; t + 1 < batch.seq_len; ++t) row[t] = row[t + 1];
    row[batch.seq_len - 1] = kIgnoreIndex;
  }
}

LoaderState DataLoader::state() const {
  LoaderState s;
  s.epoch = epoch_;
  s.next_batch = next_batch_;
  s.seed = options_.seed;
  s.num_samples = data_->size();
  s.num_tokens = data_->num_tokens();
  s.batch_size = options_.batch_size;
  s.max_seq_len = options_.packed ? options_.max_seq_len : 0;
  s.world_size = options_.world_size;
  s.shuffle = options_.shuffle;
  s.packed = options_.packed;
  s.split_across_pack = options_.packed && options_.split_across_pack;
  s.drop_last = options_.drop_last;
  return s;
}

void DataLoader::restore(const LoaderState& saved) {
  const LoaderState mine = state();
  std::vector<std::string> diffs;
  auto compare = [&](const char* name, auto a, auto b) {
    if (a != b) diffs.push_back(std::string(name) + " was " + std::to_string(a) + ", now " + std::to_string(b));
  };
  compare("seed", saved.seed, mine.seed);
  compare("num_samples", saved.num_samples, mine.num_samples);
  compare("num_tokens", saved.num_tokens, mine.num_tokens);
  compare("batch_size", saved.batch_size, mine.batch_size);
  compare("max_seq_len", saved.max_seq_len, mine.max_seq_len);
  compare("world_size", saved.world_size, mine.world_size);
  compare("shuffle", (int)saved.shuffle, (int)mine.shuffle);
  compare("packed", (int)saved.packed, (int)mine.packed);
  compare("split_across_pack", (int)saved.split_across_pack, (int)mine.split_across_pack);
  compare("drop_last", (int)saved.drop_last, (int)mine.drop_last);
  if (!diffs.empty()) {
    std::string all;
    for (const std::string& d : diffs) all += (all.empty() ? "" : "; ") + d;
    throw Error("data loader state", "the saved position belongs to other data or options: " + all);
  }
  set_epoch(saved.epoch);
  if (saved.next_batch < 0 || saved.next_batch > num_batches_)
    throw Error("data loader state", "batch " + std::to_string(saved.next_batch) + " is outside epoch " +
                                         std::to_string(saved.epoch) + " (" + std::to_string(num_batches_) + " batches)");
  next_batch_ = saved.next_batch;
}

}  // namespace ktune
