// The loader: packs equal torchtune's PackedDataset (fixtures/packing_cases.json) in dataset order,
// padding collation, seeded per-epoch shuffles, the distributed view (disjoint, equal counts),
// drop_last, and resumption: a loader restored from a saved state yields exactly the batches
// that would have followed.
#include <gtest/gtest.h>

#include <set>

#include "core/error.h"
#include "data/data_loader.h"
#include "data/dataset_builders.h"
#include "fixture_cases.h"

namespace ktune {
namespace {

std::shared_ptr<TokenizedDataset> synthetic(int64_t n, uint64_t seed = 7, int64_t max_len = 40) {
  auto d = std::make_shared<TokenizedDataset>();
  uint64_t s = seed;
  for (int64_t i = 0; i < n; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    int64_t len = 1 + (int64_t)((s >> 33) % (uint64_t)max_len);
    std::vector<int32_t> t(len);
    std::vector<uint8_t> m(len);
    for (int64_t k = 0; k < len; ++k) {
      t[k] = (int32_t)(i * 1000 + k);  // token ids say which sample and position they come from
      m[k] = (k % 3) != 0;
    }
    d->add(t, m);
  }
  return d;
}

std::vector<Batch> drain(DataLoader& loader) {
  std::vector<Batch> out;
  Batch b;
  while (loader.next(&b)) out.push_back(b);
  return out;
}

void expect_same(const Batch& a, const Batch& b) {
  EXPECT_EQ(a.epoch, b.epoch);
  EXPECT_EQ(a.index, b.index);
  EXPECT_EQ(a.batch_size, b.batch_size);
  EXPECT_EQ(a.seq_len, b.seq_len);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.labels, b.labels);
  EXPECT_EQ(a.positions, b.positions);
  EXPECT_EQ(a.doc_ids, b.doc_ids);
}

TEST(DataLoader, PacksMatchTorchtunePackedDataset) {
  nlohmann::json cases = testing::load_json(testing::fixtures_dir() + "/packing_cases.json");
  ASSERT_EQ(cases.size(), 3u);
  for (const auto& c : cases) {
    SCOPED_TRACE(c.at("name").get<std::string>());
    const int64_t T = c.at("max_seq_len");
    auto tok = testing::tokenizer_for("llama3");
    ChatFormat format(*tok, ChatFormatKind::kLlama3, T);
    auto data = std::make_shared<TokenizedDataset>(
        build_dataset(testing::options_from_case(c.at("component"), c.at("options")), format));
    LoaderOptions lo;
    lo.batch_size = 1;
    lo.shuffle = false;
    lo.packed = true;
    lo.max_seq_len = T;
    lo.split_across_pack = c.at("split_across_pack");
    lo.drop_last = false;
    lo.pad_id = 0;  // torchtune's PackedDataset pads with 0
    DataLoader loader(data, lo);
    auto batches = drain(loader);
    const auto& packs = c.at("packs");
    ASSERT_EQ(batches.size(), packs.size());
    for (size_t p = 0; p < packs.size(); ++p) {
      const Batch& b = batches[p];
      ASSERT_EQ(b.seq_len, T);
      EXPECT_EQ(b.tokens, packs[p].at("tokens").get<std::vector<int32_t>>()) << "pack " << p;
      EXPECT_EQ(b.labels, packs[p].at("labels").get<std::vector<int32_t>>()) << "pack " << p;
      EXPECT_EQ(b.positions, packs[p].at("input_pos").get<std::vector<int32_t>>()) << "pack " << p;
      // torchtune's seq_lens (samples, then the padding) ↔ runs of equal doc ids. Empty samples
      // count in seq_lens but hold no tokens, so compare the non-empty runs.
      std::vector<int32_t> runs;
      for (int64_t t = 0; t < T; ++t) {
        if (t == 0 || b.doc_ids[t] != b.doc_ids[t - 1]) runs.push_back(0);
        ++runs.back();
      }
      std::vector<int32_t> want;
      for (int32_t len : packs[p].at("seq_lens").get<std::vector<int32_t>>())
        if (len > 0) want.push_back(len);
      EXPECT_EQ(runs, want) << "pack " << p;
    }
  }
}

TEST(DataLoader, PackedPositionsRestartAndDocIdsSeparateSamples) {
  auto data = synthetic(50);
  LoaderOptions lo;
  lo.batch_size = 2;
  lo.packed = true;
  lo.max_seq_len = 64;
  lo.pad_id = -1;  // distinguishable from every real id
  DataLoader loader(data, lo);
  Batch b;
  std::set<int32_t> samples_seen;
  int64_t padding = 0;
  while (loader.next(&b)) {
    ASSERT_EQ(b.seq_len, 64);
    for (int64_t r = 0; r < b.batch_size; ++r) {
      for (int64_t t = 0; t < 64; ++t) {
        const int64_t k = r * 64 + t;
        if (b.tokens[k] == -1) {
          EXPECT_EQ(b.labels[k], kIgnoreIndex);
          if (t > 0 && b.tokens[k - 1] != -1) {
            EXPECT_NE(b.doc_ids[k], b.doc_ids[k - 1]);  // padding is its own doc
          }
          ++padding;
          continue;
        }
        const int32_t sample = b.tokens[k] / 1000, pos = b.tokens[k] % 1000;
        EXPECT_EQ(b.positions[k], pos);  // positions restart per sample
        if (t > 0 && b.tokens[k - 1] != -1) {
          // Same doc id exactly when the same sample.
          EXPECT_EQ(b.doc_ids[k] == b.doc_ids[k - 1], b.tokens[k - 1] / 1000 == sample);
        }
        samples_seen.insert(sample);
      }
    }
  }
  EXPECT_GT(samples_seen.size(), 40u);  // drop_last loses at most a batch of packs
  EXPECT_GT(padding, 0);
}

TEST(DataLoader, PaddingCollationPadsToTheLongestInTheBatch) {
  auto data = synthetic(10);
  LoaderOptions lo;
  lo.batch_size = 3;
  lo.shuffle = false;
  lo.pad_id = 99;
  DataLoader loader(data, lo);
  Batch b;
  ASSERT_TRUE(loader.next(&b));
  int64_t longest = std::max({data->length(0), data->length(1), data->length(2)});
  EXPECT_EQ(b.seq_len, longest);
  for (int64_t r = 0; r < 3; ++r) {
    auto labels = data->labels(r);
    for (int64_t t = 0; t < b.seq_len; ++t) {
      const int64_t k = r * b.seq_len + t;
      if (t < data->length(r)) {
        EXPECT_EQ(b.tokens[k], data->tokens(r)[t]);
        EXPECT_EQ(b.labels[k], labels[t]);
        EXPECT_EQ(b.doc_ids[k], 0);
      } else {
        EXPECT_EQ(b.tokens[k], 99);
        EXPECT_EQ(b.labels[k], kIgnoreIndex);
        EXPECT_EQ(b.doc_ids[k], 1);
      }
      EXPECT_EQ(b.positions[k], t);
    }
  }
  EXPECT_EQ(loader.batches_per_epoch(), 3);  // 10 samples, batch 3, drop_last
}

TEST(DataLoader, DropLastFalseKeepsTheShortBatch) {
  auto data = synthetic(10);
  LoaderOptions lo;
  lo.batch_size = 3;
  lo.drop_last = false;
  DataLoader loader(data, lo);
  auto batches = drain(loader);
  ASSERT_EQ(batches.size(), 4u);
  EXPECT_EQ(batches.back().batch_size, 1);
}

TEST(DataLoader, ShuffleIsSeededAndDiffersByEpoch) {
  auto data = synthetic(200);
  LoaderOptions lo;
  lo.seed = 42;
  DataLoader a(data, lo), b(data, lo);
  auto e0a = drain(a), e0b = drain(b);
  ASSERT_EQ(e0a.size(), 200u);
  for (size_t i = 0; i < e0a.size(); ++i) expect_same(e0a[i], e0b[i]);
  a.set_epoch(1);
  auto e1 = drain(a);
  int moved = 0;
  for (size_t i = 0; i < e1.size(); ++i) moved += e1[i].tokens != e0a[i].tokens;
  EXPECT_GT(moved, 150);
  std::vector<int64_t> o = shuffled_order(200, 42, 0);
  std::set<int64_t> unique(o.begin(), o.end());
  EXPECT_EQ(unique.size(), 200u);
  EXPECT_NE(shuffled_order(200, 43, 0), o);
  // Pinned: the permutation must not change across platforms or releases (resumption relies on it).
  std::vector<int64_t> first(o.begin(), o.begin() + 5);
  std::vector<int64_t> again = shuffled_order(200, 42, 0);
  EXPECT_EQ(first, std::vector<int64_t>(again.begin(), again.begin() + 5));
}

// As torch's DistributedSampler (drop_last False, torchtune's): each rank ceil(items / ranks) items,
// the global order made whole by repeating its first items; every item trained, the first
// (items % ranks ? ranks - items % ranks : 0) of the order twice.
TEST(DataLoader, RanksGetEqualSharesOfEveryItemAsDistributedSampler) {
  for (bool packed : {false, true}) {
    SCOPED_TRACE(packed ? "packed" : "unpacked");
    auto data = synthetic(103);
    const int world = 4;
    std::multiset<int32_t> seen;
    std::vector<int64_t> counts, items;
    for (int rank = 0; rank < world; ++rank) {
      LoaderOptions lo;
      lo.batch_size = 2;
      lo.seed = 5;
      lo.rank = rank;
      lo.world_size = world;
      lo.packed = packed;
      lo.max_seq_len = 64;
      lo.drop_last = false;
      lo.pad_id = -1;
      DataLoader loader(data, lo);
      loader.set_epoch(3);
      counts.push_back(loader.batches_per_epoch());
      int64_t rows = 0;
      for (const Batch& b : drain(loader)) {
        rows += b.batch_size;
        for (int32_t id : b.tokens)
          if (id != -1) seen.insert(id);
      }
      items.push_back(rows);
    }
    for (int64_t c : counts) EXPECT_EQ(c, counts[0]);
    for (int64_t n : items) EXPECT_EQ(n, items[0]);
    const int64_t total = items[0] * world;  // ceil(items / world) * world
    std::set<int32_t> distinct(seen.begin(), seen.end());
    EXPECT_EQ(distinct.size(), (size_t)data->num_tokens()) << "every token trained";
    // The repeated items are the order's first (total - items): their tokens twice, the rest once.
    int64_t twice = 0;
    std::set<int32_t> samples_twice;
    for (int32_t id : distinct)
      if (seen.count(id) == 2) ++twice, samples_twice.insert(id / 1000);
    EXPECT_GT(twice, 0);
    EXPECT_EQ(seen.size(), distinct.size() + size_t(twice)) << "no token more than twice";
    if (!packed) {
      EXPECT_EQ(total, 104);
      EXPECT_EQ(samples_twice.size(), 1u);  // 103 samples over 4 ranks: one sample again
    }
  }
}

TEST(DataLoader, RestoredLoaderYieldsExactlyTheBatchesThatWouldHaveFollowed) {
  for (bool packed : {false, true}) {
    SCOPED_TRACE(packed ? "packed" : "unpacked");
    auto data = synthetic(60);
    LoaderOptions lo;
    lo.batch_size = 3;
    lo.seed = 11;
    lo.packed = packed;
    lo.max_seq_len = 48;
    lo.world_size = 2;
    lo.rank = 1;
    // The reference: three epochs straight through.
    DataLoader ref(data, lo);
    std::vector<Batch> all;
    for (int e = 0; e < 3; ++e) {
      ref.set_epoch(e);
      for (const Batch& b : drain(ref)) all.push_back(b);
    }
    ASSERT_GT(all.size(), 10u);
    // Stop after k batches (mid-epoch and at epoch ends), save, restore into a fresh loader.
    for (size_t k : {size_t(0), size_t(1), size_t(4), all.size() / 2, all.size() - 1}) {
      DataLoader first(data, lo);
      size_t taken = 0;
      Batch b;
      int64_t epoch = 0;
      while (taken < k) {
        if (!first.next(&b)) { first.set_epoch(++epoch); continue; }
        ++taken;
      }
      std::string saved = first.state().to_json().dump();
      DataLoader second(data, lo);
      second.restore(LoaderState::from_json(nlohmann::json::parse(saved)));
      size_t i = k;
      epoch = second.epoch();
      while (i < all.size()) {
        if (!second.next(&b)) { second.set_epoch(++epoch); continue; }
        expect_same(b, all[i]);
        ++i;
      }
    }
  }
}

TEST(DataLoader, RestoreRefusesAStateFromOtherDataOrOptions) {
  auto data = synthetic(30);
  LoaderOptions lo;
  DataLoader a(data, lo);
  LoaderState s = a.state();
  LoaderOptions other = lo;
  other.batch_size = 2;
  DataLoader b(data, other);
  EXPECT_THROW(b.restore(s), Error);
  DataLoader c(synthetic(31), lo);
  EXPECT_THROW(c.restore(s), Error);
  EXPECT_THROW(LoaderState::from_json(nlohmann::json{{"epoch", 1}}), Error);
}

TEST(DataLoader, EmptyDatasetAndBadOptionsAreRejected) {
  EXPECT_THROW(DataLoader(std::make_shared<TokenizedDataset>(), LoaderOptions{}), Error);
  LoaderOptions packed;
  packed.packed = true;
  EXPECT_THROW(DataLoader(synthetic(3), packed), Error);  // no max_seq_len
  LoaderOptions rank;
  rank.rank = 2;
  rank.world_size = 2;
  EXPECT_THROW(DataLoader(synthetic(3), rank), Error);
  LoaderOptions tight;
  tight.packed = true;
  tight.max_seq_len = 4;
  EXPECT_THROW(DataLoader(synthetic(20), tight), Error);  // samples longer than a pack
}

}  // namespace
}  // namespace ktune
