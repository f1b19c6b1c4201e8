// Merge table, merge loop, per-thread piece cache and the byte-level alphabet (see bpe_merges.h).
// Short symbol runs (almost every pre-token) are merged with a flat scan over cached pair ranks;
// long ones (SentencePiece-style text without a pre-tokenizer) with a heap over a linked list.
#include "text/bpe_merges.h"

#include <algorithm>
#include <atomic>
#include <queue>

#include "text/unicode_text.h"

namespace ktune::text {

void MergeTable::grow() {
  size_t capacity = slots_.empty() ? 1024 : slots_.size() * 2;
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(capacity, Slot{kEmpty, 0, 0});
  mask_ = capacity - 1;
  shift_ = 64 - __builtin_ctzll(capacity);
  count_ = 0;
  for (const Slot& s : old)
    if (s.key != kEmpty) insert(int32_t(s.key >> 32), int32_t(uint32_t(s.key)), s.rank, s.merged);
}

void MergeTable::insert(int32_t left, int32_t right, int32_t rank, int32_t merged) {
  if ((count_ + 1) * 2 > slots_.size()) grow();
  uint64_t key = pack(left, right);
  size_t i = hash(key);
  while (slots_[i].key != kEmpty && slots_[i].key != key) i = (i + 1) & mask_;
  if (slots_[i].key == kEmpty) ++count_;
  slots_[i] = Slot{key, rank, merged};
}

void MergeTable::merge(std::vector<int32_t>& symbols) const {
  if (symbols.size() < 2) return;
  if (symbols.size() <= 128) merge_small(symbols);
  else merge_large(symbols);
}

void MergeTable::merge_small(std::vector<int32_t>& symbols) const {
  constexpr int32_t kNone = INT32_MAX;
  int32_t ranks[128], merged[128];  // ranks[i]: the rank of (symbols[i], symbols[i+1])
  size_t n = symbols.size();
  int32_t* s = symbols.data();
  for (size_t i = 0; i + 1 < n; ++i)
    if (!find(s[i], s[i + 1], &ranks[i], &merged[i])) ranks[i] = kNone;
  while (n > 1) {
    size_t best = 0;
    int32_t best_rank = kNone;
    for (size_t i = 0; i + 1 < n; ++i)
      if (ranks[i] < best_rank) {
        best_rank = ranks[i];
        best = i;
      }
    if (best_rank == kNone) break;
    s[best] = merged[best];
    for (size_t i = best + 1; i + 1 < n; ++i) s[i] = s[i + 1];
    for (size_t i = best + 1; i + 2 < n; ++i) {
      ranks[i] = ranks[i + 1];
      merged[i] = merged[i + 1];
    }
    --n;
    if (best > 0 && !find(s[best - 1], s[best], &ranks[best - 1], &merged[best - 1])) ranks[best - 1] = kNone;
    if (best + 1 < n && !find(s[best], s[best + 1], &ranks[best], &merged[best])) ranks[best] = kNone;
  }
  symbols.resize(n);
}

void MergeTable::merge_large(std::vector<int32_t>& symbols) const {
  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t merged;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  const int32_t n = int32_t(symbols.size());
  std::vector<int32_t> prev(n), next(n);
  std::vector<char> alive(n, 1);
  for (int32_t i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto push = [&](int32_t pos) {
    int32_t r, m;
    if (pos >= 0 && next[pos] >= 0 && find(symbols[pos], symbols[next[pos]], &r, &m)) heap.push({r, pos, m});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    Candidate c = heap.top();
    heap.pop();
    if (!alive[c.pos] || next[c.pos] < 0) continue;
    int32_t r, m;
    // A stale entry: one of the two symbols changed since it was pushed.
    if (!find(symbols[c.pos], symbols[next[c.pos]], &r, &m) || r != c.rank || m != c.merged) continue;
    int32_t right = next[c.pos];
    symbols[c.pos] = c.merged;
    alive[right] = 0;
    next[c.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = c.pos;
    push(prev[c.pos]);
    push(c.pos);
  }
  size_t out = 0;
  for (int32_t i = 0; i < n; ++i)
    if (alive[i]) symbols[out++] = symbols[i];
  symbols.resize(out);
}

// ---- PieceCache ----

struct PieceCache::Table {
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
  };
  struct Span {
    uint32_t offset, count;
  };
  std::unordered_map<std::string, Span, Hash, std::equal_to<>> index;
  std::vector<int32_t> ids;
};

namespace {
constexpr size_t kMaxCachedEntries = 1 << 17;
constexpr size_t kMaxCachedPieceBytes = 256;
std::atomic<uint64_t> g_next_owner{1};
}  // namespace

PieceCache::PieceCache() : owner_(g_next_owner.fetch_add(1)) {}

PieceCache::Table& PieceCache::table() const {
  thread_local std::unordered_map<uint64_t, Table> tables;
  thread_local uint64_t last_owner = 0;
  thread_local Table* last = nullptr;
  if (owner_ == last_owner) return *last;
  auto it = tables.find(owner_);
  if (it == tables.end()) {
    // Tables of tokenizers that are gone are never looked up again: drop them all now and then.
    if (tables.size() >= 8) tables.clear();
    it = tables.emplace(owner_, Table{}).first;
  }
  last_owner = owner_;
  last = &it->second;
  return *last;
}

bool PieceCache::lookup(std::string_view piece, std::vector<int32_t>& out) const {
  Table& t = table();
  auto it = t.index.find(piece);
  if (it == t.index.end()) return false;
  out.insert(out.end(), t.ids.begin() + it->second.offset, t.ids.begin() + it->second.offset + it->second.count);
  return true;
}

void PieceCache::store(std::string_view piece, const int32_t* ids, size_t count) const {
  if (piece.size() > kMaxCachedPieceBytes) return;
  Table& t = table();
  if (t.index.size() >= kMaxCachedEntries) {
    t.index.clear();
    t.ids.clear();
  }
  t.index.emplace(std::string(piece), Table::Span{uint32_t(t.ids.size()), uint32_t(count)});
  t.ids.insert(t.ids.end(), ids, ids + count);
}

// ---- ByteLevelAlphabet ----

ByteLevelAlphabet::ByteLevelAlphabet() {
  // Printable Latin-1 bytes stand for themselves; the rest map to U+0100 upwards, in byte order.
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    char32_t cp = printable ? char32_t(b) : char32_t(256 + extra++);
    std::string s;
    utf8_append(s, cp);
    byte_to_utf8_[b] = s;
    char_to_byte_[cp] = uint8_t(b);
  }
}

const ByteLevelAlphabet& ByteLevelAlphabet::get() {
  static const ByteLevelAlphabet alphabet;
  return alphabet;
}

bool ByteLevelAlphabet::token_to_bytes(std::string_view token, std::string* bytes) const {
  bytes->clear();
  for (size_t i = 0; i < token.size();) {
    char32_t cp;
    i += utf8_decode(token, i, &cp);
    auto it = char_to_byte_.find(cp);
    if (it == char_to_byte_.end()) return false;
    bytes->push_back(char(it->second));
  }
  return true;
}

}  // namespace ktune::text
