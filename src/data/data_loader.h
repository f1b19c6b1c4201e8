// Batches from a TokenizedDataset: seeded per-epoch shuffling, on-the-fly greedy packing or
// padding collation, a distributed view, and a resumable position.
//
// Each epoch has a plan: the order of samples (a permutation seeded by (seed, epoch), or the
// dataset order), then the items of the epoch — one sample each, or, when packed, packs made
// greedily along that order (a sample that does not fit closes the pack; with
// split_across_pack the stream of tokens is cut every max_seq_len instead, as torchtune's
// PackedDataset does for text completion). Items are dealt to ranks round-robin as torch's
// DistributedSampler deals them (torchtune's, drop_last False): each rank gets ceil(items / ranks),
// the order made whole by repeating its first items, so every rank sees the same number of
// batches (collectives never wait on a rank that ran out) and every item is trained; at most
// ranks - 1 items twice an epoch. The plan costs 8 bytes
// a sample and 16 a pack; nothing else grows with the dataset.
//
// A Batch holds (B, T) int32 arrays, row-major:
//   tokens     ids; padding = pad_id
//   labels     the token where trained, -100 elsewhere and on padding. Unshifted, as torchtune's
//              datasets give them: the recipe shifts them by one with shift_labels() below.
//   positions  packed: restart at 0 for each sample (a sample split across packs continues its
//              count), padding continues from the last position, capped at T-1 (torchtune);
//              unpacked: 0..T-1
//   doc_ids    packed: 0, 1, 2, … one per sample in the pack, the padding its own id after them;
//              unpacked: 0 for the sample, 1 for its padding. Attention is allowed only between
//              tokens with the same doc id (and causally), which keeps packed samples apart.
// Packed batches have T = max_seq_len; unpacked ones T = the longest sample in the batch
// (torchtune's padded_collate_sft).
//
// state() is the position of the next batch; a loader given that state by restore() yields
// exactly the batches that would have followed. Deliberately not here: prefetching threads,
// device copies, loss-token counting across ranks.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/tokenized_dataset.h"

namespace ktune {

struct LoaderOptions {
  int64_t batch_size = 1;
  bool shuffle = true;
  uint64_t seed = 0;
  bool packed = false;
  int64_t max_seq_len = 0;          // the pack length; required when packed
  bool split_across_pack = false;
  bool drop_last = true;            // drop the last partial batch (torchtune's loaders do)
  int rank = 0;
  int world_size = 1;
  int32_t pad_id = 0;
};

struct Batch {
  int64_t batch_size = 0;  // B (may be short for a last batch when drop_last is false)
  int64_t seq_len = 0;     // T
  std::vector<int32_t> tokens, labels, positions, doc_ids;  // each (B, T)
  int64_t epoch = 0, index = 0;  // the index-th batch of this rank in that epoch
  int64_t num_label_tokens() const;  // labels != -100
};

struct LoaderState {
  int64_t epoch = 0;
  int64_t next_batch = 0;
  // What the position means only for the same data and options; restore() checks these.
  uint64_t seed = 0;
  int64_t num_samples = 0, num_tokens = 0, batch_size = 0, max_seq_len = 0;
  int world_size = 1;
  bool shuffle = true, packed = false, split_across_pack = false, drop_last = true;

  nlohmann::json to_json() const;
  static LoaderState from_json(const nlohmann::json& j);  // throws ktune::Error on a bad state
};

class DataLoader {
 public:
  DataLoader(std::shared_ptr<const TokenizedDataset> data, LoaderOptions options);

  // Plans the epoch (order, packs, this rank's share) and rewinds to its first batch.
  void set_epoch(int64_t epoch);
  int64_t epoch() const { return epoch_; }
  int64_t batches_per_epoch() const { return num_batches_; }  // of the current epoch, this rank
  int64_t items_per_epoch() const { return num_items_; }  // samples or packs, all ranks

  // The next batch of the epoch; false (batch untouched) after the last one.
  bool next(Batch* batch);

  LoaderState state() const;
  void restore(const LoaderState& state);  // throws ktune::Error if it belongs to other data/options

  const LoaderOptions& options() const { return options_; }

 private:
  struct Cursor {
    int64_t order_pos;  // index into order_
    int64_t offset;     // token offset within that sample
  };
  void plan_epoch();
  void fill_packed_row(int64_t item, int32_t* tokens, int32_t* labels, int32_t* positions, int32_t* doc_ids) const;

  std::shared_ptr<const TokenizedDataset> data_;
  LoaderOptions options_;
  int64_t epoch_ = 0;
  int64_t next_batch_ = 0;
  int64_t num_batches_ = 0;
  int64_t num_items_ = 0;          // samples or packs this epoch, all ranks
  int64_t per_rank_ = 0;           // items this rank gets this epoch
  std::vector<int64_t> order_;     // sample order of the epoch
  std::vector<Cursor> items_;      // packed: pack k starts at items_[k], ends where k+1 starts
};

// The shift torchtune's recipes make before the loss, row by row: label[t] <- label[t+1], each
// row's last -100, so that position t is trained to predict token t+1 of its own row.
void shift_labels(Batch& batch);

// The epoch's sample order: a permutation of [0, n) from (seed, epoch), identical on every
// platform (splitmix64 + Fisher-Yates with unbiased bounded draws).
std::vector<int64_t> shuffled_order(int64_t n, uint64_t seed, int64_t epoch);

}  // namespace ktune
