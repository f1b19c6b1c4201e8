// The byte-pair-encoding machinery shared by the BPE tokenizers (HF tokenizer.json, Qwen
// vocab.json + merges.txt, tiktoken): a merge table from an adjacent pair of ids to (rank, merged
// id) in one open-addressing hash table, the merge loop (lowest rank first, leftmost among equals,
// as HF's Word::merge_all and tiktoken's _byte_pair_merge), a per-thread cache of pre-token → ids,
// and GPT-2's byte ↔ printable-character alphabet that byte-level vocabularies are spelled in.
// It deliberately knows nothing of files, regexes or special tokens.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace ktune::text {

class MergeTable {
 public:
  // A later insert of the same pair replaces the earlier (HF collects merges into a map).
  void insert(int32_t left, int32_t right, int32_t rank, int32_t merged);
  bool find(int32_t left, int32_t right, int32_t* rank, int32_t* merged) const {
    if (slots_.empty()) return false;
    uint64_t key = pack(left, right);
    size_t i = hash(key);
    while (true) {
      const Slot& s = slots_[i];
      if (s.key == key) {
        *rank = s.rank;
        *merged = s.merged;
        return true;
      }
      if (s.key == kEmpty) return false;
      i = (i + 1) & mask_;
    }
  }
  size_t size() const { return count_; }
  // Applies the merges to the symbols in place until none applies.
  void merge(std::vector<int32_t>& symbols) const;

 private:
  struct Slot {
    uint64_t key;
    int32_t rank;
    int32_t merged;
  };
  static constexpr uint64_t kEmpty = ~uint64_t(0);
  static uint64_t pack(int32_t l, int32_t r) { return (uint64_t(uint32_t(l)) << 32) | uint32_t(r); }
  size_t hash(uint64_t key) const { return size_t((key * 0x9E3779B97F4A7C15ull) >> shift_) & mask_; }
  void grow();
  void merge_small(std::vector<int32_t>& symbols) const;
  void merge_large(std::vector<int32_t>& symbols) const;

  std::vector<Slot> slots_;
  size_t mask_ = 0;
  int shift_ = 64;
  size_t count_ = 0;
};

// Memo of pre-token → ids, private to the calling thread and to one owner (a tokenizer instance),
// so that const encode() stays thread-safe without locks. Bounded: cleared when full.
class PieceCache {
 public:
  PieceCache();
  // Appends the cached ids for piece to out and returns true, or returns false.
  bool lookup(std::string_view piece, std::vector<int32_t>& out) const;
  void store(std::string_view piece, const int32_t* ids, size_t count) const;

 private:
  struct Table;
  Table& table() const;
  uint64_t owner_;
};

// GPT-2's bytes_to_unicode: each byte ↔ one printable code point, so byte-level vocabularies
// can be stored as text. 'Ġ' (U+0120) is the space byte.
class ByteLevelAlphabet {
 public:
  static const ByteLevelAlphabet& get();
  const std::string& byte_to_utf8(uint8_t b) const { return byte_to_utf8_[b]; }
  // The bytes a byte-level token stands for; false when it holds a character outside the alphabet.
  bool token_to_bytes(std::string_view token, std::string* bytes) const;

 private:
  ByteLevelAlphabet();
  std::array<std::string, 256> byte_to_utf8_;
  std::unordered_map<char32_t, uint8_t> char_to_byte_;
};

}  // namespace ktune::text
